"""td.distributed.DistributedDataParallel / DistributedOptimizer across 2 ranks.

A small program runs under `python -m tardelli.launch --nproc 2`: a td.models.GPT trained for a
few AdamW steps with DDP (td.optim.AdamW on the full parameters, gradient accumulation over two
micro-batches) and with ZeRO-1, against a single-process reference on the whole global batch
computed in the same program. Losses must agree within 1e-5 relative (Note [DP tolerance] in
tests/distributed/data_parallel_test_util.h: the two differ only by fp32 summation order).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORKER = textwrap.dedent(r"""
    import json, sys
    import tardelli as td
    import tardelli.distributed as dist
    from tardelli.distributed.data_parallel import DistributedDataParallel, DistributedOptimizer

    dist.init()
    r, n = dist.rank(), dist.world_size()
    cfg = dict(vocab_size=128, block_size=16, n_layer=2, n_head=4, d_model=64, seed=7)
    ROWS = 2  # per rank and micro-batch
    MICRO = 2

    def batch(step, rows):
        # The same tokens on every rank: a fixed function of (step, row, position).
        tok = [[(step * 31 + i * 7 + j * 13 + (i * j) % 5) % 128 for j in range(17)]
               for i in range(rows)]
        t = td.tensor(tok, dtype=td.int64)
        return t[:, :16].contiguous(), t[:, 1:].contiguous()

    def reference(steps):
        model = td.models.GPT(td.models.GPTConfig(**cfg))
        opt = td.optim.AdamW(model.param_groups(0.1), lr=3e-3)
        losses = []
        for s in range(steps):
            x, y = batch(s, ROWS * MICRO * n)
            opt.zero_grad()
            loss = model(x, y)
            loss.backward()
            td.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            losses.append(loss.item())
        return losses

    def data_parallel(steps, zero):
        model = td.models.GPT(td.models.GPTConfig(**cfg))
        ddp = DistributedDataParallel(model, bucket_mb=0.01, zero=zero)
        if zero:
            opt = DistributedOptimizer(ddp, model.param_groups(0.1), lr=3e-3)
        else:
            opt = td.optim.AdamW(model.param_groups(0.1), lr=3e-3)
        losses, collectives = [], []
        for s in range(steps):
            x, y = batch(s, ROWS * MICRO * n)
            ddp.zero_grad()
            total = 0.0
            for m in range(MICRO):
                lo = (r * MICRO + m) * ROWS
                with ddp.no_sync(m < MICRO - 1):
                    loss = ddp(x[lo:lo + ROWS].contiguous(), y[lo:lo + ROWS].contiguous())
                    (loss * (1.0 / MICRO)).backward()
                total += loss.item() / MICRO
            ddp.finish_grad_sync()
            if zero:
                opt.clip_grad_norm(0.5)
            else:
                td.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            t = td.tensor([total])
            dist.all_reduce(t, op="avg")
            losses.append(t.item())
            collectives.append(ddp.num_collectives())
        extra = {"buckets": ddp.num_buckets, "collectives": collectives}
        if zero:
            extra["state_bytes"] = opt.optimizer_state_bytes()
            extra["numel"] = sum(p.numel() for p in model.parameters())
        return losses, extra

    STEPS = 4
    out = {"ref": reference(STEPS)}
    out["ddp"], out["ddp_extra"] = data_parallel(STEPS, zero=False)
    out["zero"], out["zero_extra"] = data_parallel(STEPS, zero=True)
    if r == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.barrier()
""")


def _launch(tmp_path, nproc):
    script = tmp_path / "dp_worker.py"
    script.write_text(WORKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(_ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TD_COMM_TIMEOUT_S", "60")
    proc = subprocess.run([sys.executable, "-m", "tardelli.launch", "--nproc", str(nproc),
                           str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


def test_ddp_and_zero1_match_single_process(tmp_path):
    # Property: DDP (2 micro-batches, communication on the last only) and ZeRO-1 reproduce the
    # single-process losses of a 4-step AdamW run with clipping; ZeRO-1 keeps ~1/2 of the
    # optimizer state per rank.
    out = _launch(tmp_path, 2)
    ref = out["ref"]
    for key in ("ddp", "zero"):
        assert out[key] == pytest.approx(ref, rel=1e-5), (key, out[key], ref)
    for key in ("ddp_extra", "zero_extra"):
        extra = out[key]
        nb = extra["buckets"]
        assert nb > 3
        # One collective per bucket per step: none from the accumulation micro-batch.
        assert extra["collectives"] == [nb * (s + 1) for s in range(len(ref))]
    z = out["zero_extra"]
    assert abs(z["state_bytes"] - 8 * z["numel"] / 2) <= 8 * 2 * z["buckets"]  # 2 moments


def test_exported_from_td_distributed():
    # Property: the public names are td.distributed.DistributedDataParallel / DistributedOptimizer.
    import tardelli.distributed as dist
    from tardelli.distributed import data_parallel
    assert dist.DistributedDataParallel is data_parallel.DistributedDataParallel
    assert dist.DistributedOptimizer is data_parallel.DistributedOptimizer
