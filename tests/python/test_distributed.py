"""td.distributed and the launcher.

The multi-rank checks live in dist_worker.py (one program batching every check, since each MPI
job costs ~1 s to start here); these tests launch it with `python -m tardelli.launch` at 2 and 4
ranks. The launcher's command construction is tested directly, without running anything.
"""
import os
import re
import subprocess
import sys

import pytest

import tardelli as td
import tardelli.distributed as dist
from tardelli.distributed import launch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The ranks import the same tardelli as this process (python/ when run through conftest.py).
PYDIR = os.path.dirname(os.path.dirname(os.path.abspath(td.__file__)))

needs_mpi = pytest.mark.skipif(
    not dist.mpi_available() or launch.shutil.which("mpirun") is None,
    reason="this build has no MPI backend or mpirun is missing")


def run_launch(args, timeout=90, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "tardelli.launch", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


# ---- multi-rank ----

@needs_mpi
@pytest.mark.parametrize("nproc", [2, 4])
def test_collectives_groups_autograd_and_errors(nproc):
    """Every check of dist_worker.py passes on every rank, and only rank 0 prints the verdict."""
    r = run_launch(["--nproc", str(nproc), "--timeout", "30", "--max-time", "80",
                    os.path.join(HERE, "dist_worker.py")])
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stdout.count(f"ALL OK {nproc} ({nproc} ranks)") == 1, r.stdout


@needs_mpi
def test_exit_status_propagates(tmp_path):
    """The launcher returns the job's exit status (here 3 from every rank), and `-m module` with
    arguments reaches the program unchanged."""
    prog = tmp_path / "exit3.py"
    prog.write_text("import sys\nsys.stdout.write(f'args {sys.argv[1:]}\\n')\nsys.exit(3)\n")
    r = run_launch(["--nproc", "2", str(prog), "--flag", "x"])
    assert r.returncode == 3, r.stderr
    assert r.stdout.count("['--flag', 'x']") == 2, r.stdout  # ranks' lines may interleave
    # One failing rank fails the job.
    prog.write_text("import os, sys\n"
                    "sys.exit(5 if os.environ.get('OMPI_COMM_WORLD_RANK') == '1' else 0)\n")
    r = run_launch(["--nproc", "2", str(prog)])
    assert r.returncode == 5, r.stderr


@needs_mpi
def test_module_launch_and_main_process(tmp_path):
    """`-m module` runs a module by name on each rank; is_main_process() is true on rank 0 only,
    before and after init()."""
    (tmp_path / "td_probe_mod.py").write_text(
        "import tardelli.distributed as dist\n"
        "before = dist.is_main_process()\n"
        "dist.init()\n"
        "print(f'probe {dist.rank()} {before} {dist.is_main_process()};', flush=True)\n"
        "dist.destroy()\n")
    r = run_launch(["--nproc", "2", "-m", "td_probe_mod"],
                   env_extra={"PYTHONPATH": str(tmp_path) + os.pathsep + PYDIR})
    assert r.returncode == 0, r.stderr
    found = sorted(re.findall(r"probe \d \w+ \w+;", r.stdout))  # ranks' lines may interleave
    assert found == ["probe 0 True True;", "probe 1 False False;"], r.stdout


# ---- launcher command construction (nothing is run) ----

def which_mpirun(name):
    return {"mpirun": "/usr/bin/mpirun", "srun": None}.get(name)


def test_command_oversubscribe_only_above_core_count():
    """--oversubscribe appears exactly when nproc > cores; --bind-to none always; the program runs
    under this interpreter; PYTHONPATH is exported to the ranks."""
    env = {"PYTHONPATH": "/x"}
    argv, _ = launch.build_command(4, ["script.py", "a"], env=env, cpu_count=2, is_root=False,
                                   which=which_mpirun, flavor="openmpi")
    assert argv[:3] == ["/usr/bin/mpirun", "-np", "4"]
    assert "--oversubscribe" in argv
    assert argv[argv.index("--bind-to") + 1] == "none"
    assert argv[-3:] == [sys.executable, "script.py", "a"]
    assert argv[argv.index("-x") + 1] == "PYTHONPATH"
    argv, _ = launch.build_command(2, ["script.py"], env=env, cpu_count=2, is_root=False,
                                   which=which_mpirun, flavor="openmpi")
    assert "--oversubscribe" not in argv


def test_command_as_root():
    """As root, Open MPI gets --allow-run-as-root and the two OMPI_ALLOW_RUN_AS_ROOT variables."""
    argv, env = launch.build_command(2, ["-m", "m"], env={}, cpu_count=8, is_root=True,
                                     which=which_mpirun, flavor="openmpi")
    assert "--allow-run-as-root" in argv
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    argv, env = launch.build_command(2, ["-m", "m"], env={}, cpu_count=8, is_root=False,
                                     which=which_mpirun, flavor="openmpi")
    assert "--allow-run-as-root" not in argv and "OMPI_ALLOW_RUN_AS_ROOT" not in env
    assert argv[-3:] == [sys.executable, "-m", "m"]


def test_command_under_slurm_and_mpich():
    """Under SLURM with srun on PATH the job starts through `srun -n N`; without srun, mpirun.
    MPICH gets its own spelling (no Open MPI-only flags)."""
    def which_all(name):
        return "/usr/bin/" + name
    argv, _ = launch.build_command(8, ["t.py"], env={"SLURM_JOB_ID": "42"}, cpu_count=2,
                                   is_root=True, which=which_all)
    assert argv[:3] == ["srun", "-n", "8"] and argv[-2:] == [sys.executable, "t.py"]
    assert "--oversubscribe" not in argv
    argv, _ = launch.build_command(8, ["t.py"], env={"SLURM_JOB_ID": "42"}, cpu_count=2,
                                   is_root=False, which=which_mpirun, flavor="openmpi")
    assert argv[0] == "/usr/bin/mpirun"
    argv, _ = launch.build_command(8, ["t.py"], env={"PYTHONPATH": "/x"}, cpu_count=2,
                                   is_root=True, which=which_mpirun, flavor="mpich")
    assert "--oversubscribe" not in argv and "--allow-run-as-root" not in argv
    # OMP_NUM_THREADS defaults to cores // nproc (here max(1, 2 // 8) = 1) and is forwarded.
    assert argv[argv.index("-genvlist") + 1] == "PYTHONPATH,OMP_NUM_THREADS"


def test_argument_parsing():
    """Launcher options stop at `-m module` or the script; the rest is the program's, even when it
    looks like launcher options."""
    args, prog = launch._parse(["--nproc", "4", "--timeout", "9", "-m", "tardelli.train",
                                "--nproc", "7", "-m", "x"])
    assert args.nproc == 4 and args.timeout == 9.0
    assert prog == ["-m", "tardelli.train", "--nproc", "7", "-m", "x"]
    args, prog = launch._parse(["--nproc=2", "train.py", "--lr", "3"])
    assert args.nproc == 2 and prog == ["train.py", "--lr", "3"]
    with pytest.raises(SystemExit):
        launch._parse(["--nproc", "2"])  # no program
    with pytest.raises(ValueError):
        launch.build_command(0, ["t.py"], env={}, which=which_mpirun, flavor="openmpi")


# ---- single process ----

def test_single_process_api_without_init():
    """Without init(): is_main_process() is true, and group-less calls raise a clear error."""
    assert not dist.is_initialized()
    assert dist.is_main_process() == (os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0")
    with pytest.raises(td.TardelliError, match="not initialized"):
        dist.all_reduce(td.ones(2))
    with pytest.raises(td.TardelliError, match="unknown axis 'xp'"):
        dist.ParallelDims(tp=2, dp=2).rank_groups("xp")
    d = dist.ParallelDims(tp=2, pp=2, dp=2)
    assert d.world_size == 8
    assert d.rank_groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert (d.coords(5).tp, d.coords(5).dp, d.coords(5).pp) == (1, 0, 1)
