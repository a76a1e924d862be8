"""The planner on paper at Megatron-LM's scale: predicted MFU of GPT configurations on the
hand-written H100 profile (profiles/h100_megatron.json) next to what Megatron-LM's README
publishes (`python -m tardelli.plan megatron`; docs/planner.md, "At scale, on paper").

The README's scaling table is an image; its text gives the points compared here: "MFU increases
from 41% for the smallest model considered to 47-48% for the largest models" (vocabulary
131,072, sequence 4096, up to 6144 H100s), and GPT-3 175B strong-scaled at batch 1152 from 96 to
4608 GPUs with MFU falling "from 47% to 42%". The model shapes below are GPT-3-family shapes
chosen to match those sizes (1.7B, 175B, 462B) and the layouts are Megatron's usual ones; they
are reconstructions, not the table's rows (docs/planner.md says which numbers are which)."""
import json
import os

from .layout import Layout, ModelSpec
from .profile import Machine, load
from .search import evaluate

PROFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles",
                       "h100_megatron.json")
PEAK_BF16 = 989e12  # H100 SXM dense bf16 FLOP/s: the MFU denominator Megatron uses
HBM_BYTES = 80e9    # an H100 SXM's memory

# (label, layers, hidden, heads, gpus, tp, pp, vpp, global batch, published MFU or range)
ROWS = [
    ("1.7B", 28, 2048, 16, 64, 1, 1, 1, 256, (0.41, 0.41)),
    ("7.0B", 32, 4096, 32, 128, 2, 1, 1, 512, (0.41, 0.48)),
    ("13B", 40, 5120, 40, 256, 2, 2, 1, 768, (0.41, 0.48)),
    ("175B @ 96 GPUs", 96, 12288, 96, 96, 4, 8, 3, 1152, (0.47, 0.47)),
    ("175B @ 4608 GPUs", 96, 12288, 96, 4608, 4, 8, 6, 1152, (0.42, 0.42)),
    ("462B", 96, 19968, 156, 6144, 8, 12, 4, 1536, (0.47, 0.48)),
]


# Note [Megatron's memory]: the published runs had to fit in 80 GB; the layouts here are
# reconstructions (tp, pp, vpp of Megatron's usual kind), so their recomputation is the least
# that fits by Megatron's own accounting (Korthikanti et al. 2022, and its distributed
# optimizer): per parameter of the first pipeline rank 2 bytes (bf16 weights) + 4 (fp32 main
# gradients) + 12 / dp (fp32 master weights and Adam's two moments, sharded over dp); per layer
# and micro-batch of sequence s, 34 s h / tp bytes of activations with sequence parallelism and
# selective recomputation, or the 2 s h / tp input alone with full recomputation (plus one chunk
# rebuilt during its backward); the first rank holds min(m, pp) micro-batches of its L / pp
# layers under 1F1B, and (pp - 1) 2 + (vpp - 1) pp + 1 chunks of L / (pp vpp) layers under the
# interleaved schedule (its warm-up). Only 175B on 96 GPUs needs more than selective
# recomputation: 58 GB of states (dp 3 barely shards the optimizer) and 53 GB of activations.
def megatron_flops(L, h, s, V, batch):
    """Megatron's model FLOPs per step (Narayanan et al. 2021, without recomputation):
    72 B s L h^2 (1 + s / 6h + V / 12 L h); attention counted without the causal halving."""
    return 72.0 * batch * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def megatron_memory(spec, gpus, tp, pp, vpp, gbs, recompute):
    """Bytes on Megatron's busiest (first) pipeline rank, by Megatron's own accounting (Note
    [Megatron's memory]): (model states, activations)."""
    dp = gpus // (tp * pp)
    L, h, s, V = spec.layers, spec.d_model, spec.seq_len, spec.vocab_size
    # The first stage's blocks and the (tp-split) embedding.
    params = (spec.total_params() - V * h) / (tp * pp) + V * h / tp
    states = params * (2 + 4 + 12 / dp)
    m = gbs // dp
    per_chunk = L // (pp * vpp)
    if vpp > 1:  # interleaved 1F1B: the first rank's warm-up chunks, then one more
        held = min(m * vpp, (pp - 1) * 2 + (vpp - 1) * pp + 1) * per_chunk
    else:
        held = min(m, pp) * (L // pp)
    sel = 34 * s * h / tp  # bytes per layer and sequence, SP + selective recomputation
    if recompute == "selective":
        act = held * sel
    else:  # the checkpointed inputs, and one chunk rebuilt during its backward
        act = held * 2 * s * h / tp + per_chunk * sel
    return states, act


def table(profile_path=PROFILE):
    machine = Machine(load(profile_path))
    out = []
    for label, L, h, H, gpus, tp, pp, vpp, gbs, pub in ROWS:
        spec = ModelSpec("gpt2", L, h, H, H, 4 * h, 4096, 131072, "bf16")
        dp = gpus // (tp * pp)
        # Note [Megatron's memory]: the least recomputation that fits in an H100.
        recompute = "selective"
        if sum(megatron_memory(spec, gpus, tp, pp, vpp, gbs, recompute)) > HBM_BYTES:
            recompute = "full"
        mem = sum(megatron_memory(spec, gpus, tp, pp, vpp, gbs, recompute))
        lay = Layout(tp=tp, pp=pp, vpp=vpp, dp=dp, sequence_parallel=tp > 1, micro_batch_size=1,
                     zero=1, recompute=recompute,
                     schedule="interleaved" if vpp > 1 else "1f1b")
        r = evaluate(spec, lay, gbs, machine, gpus)
        sec = r["step_ms"] / 1e3
        mfu = megatron_flops(L, h, 4096, 131072, gbs) / (sec * gpus * PEAK_BF16)
        lo, hi = pub
        err = 0.0 if lo <= mfu <= hi else min(abs(mfu - lo) / lo, abs(mfu - hi) / hi)
        out.append({"model": label, "params_b": round(spec.total_params() / 1e9, 2),
                    "gpus": gpus, "flags": r["flags"], "global_batch": gbs,
                    "step_s": round(sec, 3), "predicted_mfu": round(mfu, 4),
                    "published_mfu": pub[0] if lo == hi else list(pub),
                    "rel_error": round(err, 4), "megatron_memory_gb": round(mem / 1e9, 1),
                    "bubble": r["breakdown"].get("bubble_fraction")})
    return out


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m tardelli.plan megatron",
                                 description="Predicted MFU of Megatron-LM's H100 scaling runs")
    ap.add_argument("--profile", default=PROFILE)
    a = ap.parse_args(argv)
    for row in table(a.profile):
        print(json.dumps(row))
    return 0
