"""td.distributed's tensor-parallel layers (tardelli/distributed/tensor_parallel.py).

The multi-rank checks live in tp_worker.py (one program batching every check, since each MPI job
costs ~1 s to start here); these tests launch it with `python -m tardelli.launch` at 2 and 4
ranks. A one-rank group (tp = 1) is checked in this process: the layers must then be exactly
td.nn.Linear / td.nn.Embedding / cross_entropy.
"""
import os
import subprocess
import sys

import pytest

import tardelli as td
import tardelli.distributed as dist
from tardelli.distributed import launch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(td.__file__)))

needs_mpi = pytest.mark.skipif(
    not dist.mpi_available() or launch.shutil.which("mpirun") is None,
    reason="this build has no MPI backend or mpirun is missing")


@needs_mpi
@pytest.mark.parametrize("nproc", [2, 4])
def test_parallel_layers_match_dense(nproc):
    """Every check of tp_worker.py passes on every rank: column/row-parallel linears, a 2-layer
    MLP (with and without sequence parallelism), the vocab-parallel embedding and cross-entropy
    (padded vocabularies, ignore_index), init, the RNG tracker and errors."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    r = subprocess.run([sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc),
                        "--timeout", "30", "--max-time", "100", os.path.join(HERE, "tp_worker.py")],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stdout.count(f"TP OK {nproc} ({nproc} ranks)") == 1, r.stdout


def test_single_process_helpers():
    """padded_vocab_size rounds up to a multiple of make_divisible_by * tp; the functions exist
    without a process group; group-less layers ask for init()."""
    assert dist.padded_vocab_size(1000, 4, 1) == 1000
    assert dist.padded_vocab_size(1001, 4, 1) == 1004
    assert dist.padded_vocab_size(50257, 2) == 50432
    assert dist.padded_vocab_size(1, 1) == 128
    with pytest.raises(td.TardelliError):
        dist.padded_vocab_size(0, 2)
    if not dist.is_initialized():
        with pytest.raises(td.TardelliError, match="not initialized"):
            dist.ColumnParallelLinear(4, 4)


@needs_mpi
def test_one_rank_group_equals_dense(tmp_path):
    """At tp = 1 (a one-process job) the layers are exactly the dense ones: same init, bitwise
    equal forward; the vocab-parallel loss equals cross_entropy."""
    prog = tmp_path / "tp1.py"
    prog.write_text(
        "import numpy as np, tardelli as td, tardelli.distributed as dist\n"
        "import tardelli.nn.functional as F\n"
        "dist.init()\n"
        "x = td.randn(3, 5, 6, generator=td.Generator(1))\n"
        "td.manual_seed(7); d = td.nn.Linear(6, 4)\n"
        "td.manual_seed(7); c = dist.ColumnParallelLinear(6, 4)\n"
        "td.manual_seed(7); r = dist.RowParallelLinear(6, 4)\n"
        "assert np.array_equal(c(x).detach().numpy(), d(x).detach().numpy())\n"
        "assert np.allclose(r(x).detach().numpy(), d(x).detach().numpy(), rtol=0, atol=1e-6)\n"
        "td.manual_seed(8); e = td.nn.Embedding(10, 3)\n"
        "td.manual_seed(8); v = dist.VocabParallelEmbedding(10, 3, make_divisible_by=1)\n"
        "ids = td.tensor([[1, 9], [0, 3]], dtype=td.int64)\n"
        "assert np.array_equal(v(ids).detach().numpy(), e(ids).detach().numpy())\n"
        "lg = td.randn(4, 10, generator=td.Generator(2)); t = td.tensor([1, 9, -100, 0])\n"
        "a = dist.vocab_parallel_cross_entropy(lg, t, 10).item()\n"
        "b = F.cross_entropy(lg, t).item()\n"
        "assert abs(a - b) <= 1e-6 * abs(b), (a, b)\n"
        "print('TP1 OK', flush=True)\n"
        "dist.destroy()\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "tardelli.launch", "--nproc", "1", str(prog)],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "TP1 OK" in r.stdout, f"{r.stdout}\n{r.stderr}"
