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

# (label, layers, hidden, heads, gpus, tp, pp, vpp, global batch, published MFU or range)
ROWS = [
    ("1.7B", 28, 2048, 16, 64, 1, 1, 1, 256, (0.41, 0.41)),
    ("7.0B", 32, 4096, 32, 128, 2, 1, 1, 512, (0.41, 0.48)),
    ("13B", 40, 5120, 40, 256, 2, 2, 1, 768, (0.41, 0.48)),
    ("175B @ 96 GPUs", 96, 12288, 96, 96, 4, 8, 3, 1152, (0.47, 0.47)),
    ("175B @ 4608 GPUs", 96, 12288, 96, 4608, 4, 8, 6, 1152, (0.42, 0.42)),
    ("462B", 96, 19968, 156, 6144, 8, 12, 4, 1536, (0.47, 0.48)),
]


def megatron_flops(L, h, s, V, batch):
    """Megatron's model FLOPs per step (Narayanan et al. 2021, without recomputation):
    72 B s L h^2 (1 + s / 6h + V / 12 L h); attention counted without the causal halving."""
    return 72.0 * batch * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def table(profile_path=PROFILE):
    machine = Machine(load(profile_path))
    out = []
    for label, L, h, H, gpus, tp, pp, vpp, gbs, pub in ROWS:
        spec = ModelSpec("gpt2", L, h, H, H, 4 * h, 4096, 131072, "bf16")
        dp = gpus // (tp * pp)
        lay = Layout(tp=tp, pp=pp, vpp=vpp, dp=dp, sequence_parallel=tp > 1, micro_batch_size=1,
                     zero=1, recompute="selective",
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
                    "rel_error": round(err, 4),
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
