"""python -m tardelli.train with ZeRO-2, ZeRO-3 (FSDP) and optimizer offload under
`python -m tardelli.launch --nproc N`: losses against one process with the same global batch,
exact resume, per-rank peak memory against the model's sizes, and bad combinations refused."""
import json

import numpy as np
import pytest

import tardelli as td
from tardelli.train import ConfigError, parse_config

from cli_runner import run

# 8 samples per step; with --micro-batch-size m and N ranks every step accumulates
# 8 / (m N) micro-batches. gpt2: its tied head re-gathers the table under ZeRO-3, and under
# pp the two copies of the table sum their gradient shards.
BASE = ["--synthetic-data", "--vocab-size", "128", "--layers", "2", "--d-model", "64",
        "--heads", "2", "--seq-len", "32", "--global-batch-size", "8", "--steps", "4",
        "--warmup-steps", "1", "--lr", "3e-3", "--no-progress", "--eval-interval", "0",
        "--log-interval", "1", "--ddp-bucket-mb", "0.05"]

pytestmark = pytest.mark.skipif(not td.distributed.mpi_available(),
                                reason="built without MPI (TD_WITH_MPI=OFF)")


def train(nproc, *args, check=True):
    return run(nproc, "tardelli.train", *BASE, *args, check=check, timeout=400)


def summary(p):
    return json.loads([x for x in p.stdout.splitlines() if '"train_end"' in x][0])


def losses(path):
    return [json.loads(line)["loss"] for line in open(path)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    m = tmp_path_factory.mktemp("ref") / "m.jsonl"
    train(1, "--micro-batch-size", "8", "--metrics-file", str(m))
    return losses(m)


_RUNS = {}


def losses_of(tmp_path_factory, nproc, *args):
    """The metrics of one uninterrupted run (cached: the resume tests reuse them)."""
    key = (nproc,) + args
    if key not in _RUNS:
        m = tmp_path_factory.mktemp("run") / "m.jsonl"
        train(nproc, *args, "--metrics-file", str(m))
        _RUNS[key] = losses(m)
    return _RUNS[key]


CASES = [
    (2, ["--micro-batch-size", "2", "--zero", "2"]),
    (4, ["--micro-batch-size", "1", "--zero", "2"]),
    (2, ["--micro-batch-size", "2", "--zero", "3"]),
    (4, ["--micro-batch-size", "1", "--zero", "3"]),
    (4, ["--micro-batch-size", "2", "--zero", "3", "--tp", "2", "--sequence-parallel"]),
    (4, ["--micro-batch-size", "1", "--zero", "3", "--pp", "2"]),
    (4, ["--micro-batch-size", "1", "--zero", "2", "--pp", "2"]),
    (2, ["--micro-batch-size", "2", "--zero", "1", "--offload-optimizer"]),
    (2, ["--micro-batch-size", "2", "--zero", "3", "--offload-optimizer"]),
]


@pytest.mark.parametrize("nproc, args", CASES, ids=[" ".join(map(str, [n] + a))
                                                    for n, a in CASES])
def test_zero_losses_match_one_rank(reference, tmp_path_factory, nproc, args):
    # Property: whatever is sharded (gradients, parameters, the optimizer state) or offloaded,
    # a step is the single-process step on the same global batch, with gradient accumulation
    # (2 micro-batches per rank per step in every case): the gradient is the same mean summed
    # in another order, so 4 AdamW steps' losses agree to fp32 rounding (relative 1e-5; the
    # accumulation of per-micro-batch reduce-scatters re-associates the sums once more).
    np.testing.assert_allclose(losses_of(tmp_path_factory, nproc, *args), reference, rtol=1e-5)


def test_zero3_bf16_gathers_match_zero0_bf16(tmp_path_factory):
    # Property (Note [Compute-dtype gathers]): in bf16 ZeRO-3 gathers the blocks in bf16 over
    # fp32 shards; the ops see the same bf16 weights as ZeRO-0's casts, so 4 steps' losses agree
    # with a ZeRO-0 bf16 run to fp32 rounding of the gradient sums (relative 1e-5; bf16 itself
    # would allow 1e-2).
    args = ["--micro-batch-size", "2", "--dtype", "bf16"]
    np.testing.assert_allclose(losses_of(tmp_path_factory, 2, *args, "--zero", "3"),
                               losses_of(tmp_path_factory, 2, *args, "--zero", "0"), rtol=1e-5)


RESUME = [
    (2, ["--micro-batch-size", "2", "--zero", "2"]),
    (2, ["--micro-batch-size", "2", "--zero", "3"]),
    (4, ["--micro-batch-size", "1", "--zero", "3", "--pp", "2"]),
    (2, ["--micro-batch-size", "2", "--zero", "3", "--offload-optimizer"]),
]


@pytest.mark.parametrize("nproc, args", RESUME, ids=[" ".join(map(str, [n] + a))
                                                     for n, a in RESUME])
def test_zero_resume_is_bitwise(tmp_path_factory, tmp_path, nproc, args):
    # Property: a run stopped after step 2 and resumed (each rank reads its optimizer shard's
    # boxes back; ZeRO-3 also its parameter shards) repeats the uninterrupted run's losses bit
    # for bit; every rank wrote a shard file.
    full = losses_of(tmp_path_factory, nproc, *args)
    part, save = tmp_path / "part.jsonl", tmp_path / "save"
    train(nproc, *args, "--metrics-file", str(part), "--save", str(save), "--exit-interval", "2")
    step_dir = save / "step_00000002"
    assert len(list(step_dir.glob("shards.rank*.safetensors"))) == nproc
    train(nproc, *args, "--metrics-file", str(part), "--save", str(save), "--resume")
    assert losses(part) == full


def test_zero3_checkpoint_generates(tmp_path):
    # Property: a ZeRO-3 checkpoint holds every parameter whole (the gathered parameters'
    # pieces), so the one-process loader builds the model from it.
    save = tmp_path / "save"
    p = train(2, "--micro-batch-size", "2", "--zero", "3", "--save", str(save), "--steps", "2",
              "--eval-interval", "2", "--eval-steps", "2")
    from tardelli.train import state
    model, reader = state.load_model(str(save / "step_00000002"))
    saved = td.checkpoint.PieceIndex(reader).names()
    assert sorted(dict(model.named_parameters())) == \
        sorted(n for n in saved if not n.endswith((".exp_avg", ".exp_avg_sq")))
    assert "val_loss" in summary(p)


# Memory: 4 layers of d 128 (0.8M parameters, mostly blocks) and tiny activations (seq 16,
# micro-batch 1), so parameter, gradient and optimizer bytes dominate the peak.
MEM = ["--layers", "4", "--d-model", "128", "--heads", "4", "--seq-len", "16",
       "--micro-batch-size", "1", "--global-batch-size", "4", "--steps", "2",
       "--ddp-bucket-mb", "1", "--arch", "llama"]


def test_zero3_memory_per_rank(tmp_path):
    # Property: ZeRO-3 at dp 4 keeps about a quarter of stage 0's bytes per parameter between
    # steps and its peak falls accordingly (docs/memory.md, "ZeRO stages"). With N parameters
    # (fp32 everywhere), the allocator's bytes on rank 0:
    #   after a step (current):  zero 0: 4N params + 4N buckets + 8N AdamW moments = 16N + B
    #                            zero 3: (4 + 4 + 8) N / 4 shards                =  4N + <= B
    #   (ZeRO-3's fp32 parameter shards are the AdamW masters: Note [Masters are the parameters])
    #   B: what zero 0 holds besides (rope tables, optimizer step counts, ...), taken from its
    #   run; zero 3 holds at most that much besides its shards.
    #   peak: zero 3 <= its current + A + W, A = zero 0's peak - its current (activations and
    #   temporaries, which include full-size optimizer temporaries zero 3 does not have), W =
    #   the working set: two gathered units and three full gradient buckets (the one being
    #   accumulated, two reductions in flight) of the largest block, one block of weight-
    #   gradient temporaries, and the table and head units twice.
    # Keeping parameters, gradients or the optimizer state whole would add >= 3N bytes to both.
    out = {}
    for zero in (0, 3):
        out[zero] = summary(train(4, *MEM, "--zero", str(zero)))
    n = out[0]["params"]
    cfg = td.models.GPTConfig(arch="llama", vocab_size=128, block_size=16, n_layer=4, n_head=4,
                              d_model=128)
    units = [sum(p.numel() for _, p in u) for u in td.models.GPT(cfg)._cpp.param_units()]
    assert sum(units) == n
    block, table, head = max(units[2:-1]), units[0], units[-1]
    cur0, cur3 = out[0]["mem_current_bytes"], out[3]["mem_current_bytes"]
    peak0, peak3 = out[0]["peak_mem_bytes"], out[3]["peak_mem_bytes"]
    base = cur0 - 16 * n
    padding = 4 * 20 * len(units)  # each unit padded to a multiple of dp = 4
    print(f"N {n}: zero0 current {cur0} peak {peak0}; zero3 current {cur3} peak {peak3}")
    assert 0 <= base < n
    assert 4 * n - padding <= cur3 <= 4 * n + base + padding
    assert cur3 < 0.3 * cur0  # 4/16 and the baseline
    work = 4 * (6 * block + 2 * (table + head))
    assert peak3 <= cur3 + (peak0 - cur0) + work
    assert peak3 < peak0
    assert out[3]["optimizer_state_bytes"] == pytest.approx(8 * n / 4, rel=0.01)


def test_offload_moves_optimizer_state_to_host():
    # Property: with --offload-optimizer the whole optimizer state of the shard (12 bytes per
    # element) plus the gradient copy (4) lives in host tensors: host_state_bytes = 16/12 of
    # optimizer_state_bytes; without it none.
    on = summary(train(2, "--micro-batch-size", "4", "--zero", "2", "--offload-optimizer",
                       "--steps", "1"))
    off = summary(train(2, "--micro-batch-size", "4", "--zero", "2", "--steps", "1"))
    assert on["host_state_bytes"] * 12 == on["optimizer_state_bytes"] * 16
    assert off["host_state_bytes"] == 0


@pytest.mark.parametrize("args, message", [
    (["--zero", "4"], "--zero must be 0, 1, 2 or 3, got 4"),
    (["--offload-optimizer"], "--offload-optimizer needs --zero 1, 2 or 3"),
    (["--zero", "3", "--pp", "2", "--layers", "2", "--schedule", "zb"],
     "--zero 3 with --schedule zb is not supported"),
])
def test_bad_zero_configs_are_rejected(args, message):
    # Property: an unknown stage or an unsupported combination is a ConfigError naming the
    # flags, raised by parse_config before any training work.
    base = ["--synthetic-data", "--vocab-size", "64"]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse_config(base + args, world_size=2)


def test_bad_zero_config_stops_every_rank_with_status_2():
    # Property: launched on 2 ranks, a bad --zero ends the job with status 2 and the message
    # (no rank starts training, no traceback, no hang).
    p = train(2, "--micro-batch-size", "4", "--zero", "4", check=False)
    assert p.returncode == 2, p.stderr
    assert "--zero must be 0, 1, 2 or 3, got 4" in p.stderr
    assert "Traceback" not in p.stderr
