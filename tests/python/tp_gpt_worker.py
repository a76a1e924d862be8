"""One rank of the GPT tensor/sequence-parallel checks of test_gpt_tensor_parallel.py (run
through tardelli.launch at 2, 4 and 8 ranks).

Every layout (tp, dp) with tp in {2, 4}, tp x dp = the world size, trains a tiny gpt2 and a tiny
llama for STEPS steps with sequence parallelism off and on, built only with the library API:

    model = td.models.GPT(cfg)                          # the full model from cfg.seed
    parallelize(model, grid, sequence_parallel=sp)      # this rank's shards
    ddp = dist.DistributedDataParallel(model, group=grid.dp())
    td.optim.AdamW + clip_grad_norm_(model, CLIP, grid.tp())   (or ZeRO-1: DistributedOptimizer
                                                                 + set_model_parallel)

and rank 0 compares it with one process training the unsplit model on the global batch (the
concatenation of every dp rank's micro-batch) with td.optim.AdamW and td.nn.utils.clip_grad_norm_.
Further checks: dropout under sequence parallelism (reproducible, active), the exact per-rank
parameter count of every layout, and the activation memory saved by sequence parallelism.

The program exits non-zero on the first failed check (after printing it on the failing rank);
rank 0 prints one "TPGPT ..." line of measured numbers per check and "TPGPT OK <world size>"
when every rank passed.

Tolerances (fp32 throughout):
  - loss, relative 1e-5 (the issue's bar): step 1 differs only by re-associated sums (row-
    parallel partial products added over tp, the loss's max/sum-exp reduced over tp, the dp mean
    of micro-batch losses), ~1e-7 relative; later steps also carry the parameter differences
    below, which move the loss by far less than 1e-5.
  - grad norm, relative 1e-5: the norm of the full gradient, a sum of squares of gradients whose
    elements differ by a few ulps (sums re-associated over tp and dp); measured ~1e-7.
  - step-1 gradients (clipped, before the first update), relative 1e-5 of each tensor's
    largest element: one backward of re-associated fp32 sums; measured <= 9e-7.
  - final parameters, absolute PARAM_ATOL = 5e-6 = 5e-4 x LR, with Adam's EPS = 1e-3. The
    update u = m / (sqrt(v) + eps) changes by at most ~3 |dg| / eps when the gradient changes
    by dg, so 4 steps move a parameter by at most 4 x LR x 3 |dg| / eps = 120 |dg|, ~1e-6 for
    the ~1e-8 absolute gradient differences of re-associated sums, on top of 1-ulp differences
    of the update itself (6e-8 at |p| ~ 1, the norm weights); measured <= 1.3e-7. With the
    default eps = 1e-8 Adam normalizes every element, including those whose gradient is at its
    own rounding level (gpt2's key biases: their exact gradient is 0, since q.b_k shifts a
    whole row of scores and softmax ignores it; the computed one is ~1e-12 of noise), and
    their update can flip sign: measured differences up to 2.3e-4 = 2% of LR, which would need
    a tolerance blind to small errors. Parameters move ~3.5e-2 in 4 steps; a wrong shard,
    reduction or update moves them by O(LR) = 1e-2, 2000x the tolerance; a wrong gradient
    scale, which Adam would nearly hide, is caught by the norm and gradient checks.
  - replicated parameters (norms, wpe, row-parallel biases) are bitwise equal on every tp rank,
    and every parameter shard is bitwise equal over the dp replicas (the same reduced gradient
    and the same update everywhere).
"""
import sys
import traceback

import numpy as np

import tardelli as td
import tardelli.distributed as dist
from tardelli.distributed.model_parallel import clip_grad_norm_, parallelize



def put_shard(shard, spec, full):
    """Writes `shard` into its place in `full` (nn::ShardSpec::put; padding dropped)."""
    td._C.parallel.put_shard(shard, full, spec["dim"], spec["segments"], spec["parts"],
                             spec["index"])


VOCAB = 301  # odd: padded under every tp (to 512 with the default multiple of 128)
SEQ = 16
MICRO = 2
STEPS = 4
LR = 1e-2
WD = 0.1
BETAS = (0.9, 0.95)
EPS = 1e-3  # see the tolerances above: Adam's update is then Lipschitz in the gradient
CLIP = 0.6  # below every step-1 norm measured (0.75-2.1): clipping is active
LOSS_REL = 1e-5
NORM_REL = 1e-5
GRAD_REL = 1e-5
PARAM_ATOL = 5e-6


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {dist.rank()}: {what}")


def log(msg):
    if dist.rank() == 0:
        print(f"TPGPT {msg}", flush=True)


def arr(t):
    return np.array(t.detach().float().numpy(), dtype=np.float64)


def config(arch, kv, dropout=0.0, **kw):
    # llama: n_kv_head = kv (the tp size, or a multiple) keeps GQA splittable; ffn_hidden is
    # explicit so the parameter-count formula below reads it from the config.
    base = dict(arch=arch, vocab_size=VOCAB, block_size=SEQ, n_layer=2, n_head=4, d_model=32,
                ffn_hidden=128 if arch == "gpt2" else 96, dropout=dropout, dtype="fp32",
                seed=1234)
    if arch == "llama":
        base["n_kv_head"] = kv
    base.update(kw)
    return td.models.GPTConfig(**base)


def batches(global_batch, vocab=VOCAB, seq=SEQ, steps=STEPS, seed=77):
    """[steps] of (x, y) numpy int64 [global_batch, seq]: the same on every rank."""
    g = td.Generator(seed)
    tok = td.randint(0, vocab, (steps, global_batch, seq + 1), generator=g).numpy()
    return [(tok[s, :, :-1].copy(), tok[s, :, 1:].copy()) for s in range(steps)]


def ids(a):
    return td.tensor(np.ascontiguousarray(a), dtype=td.int64)


def gather_floats(values, group):
    """Every rank's list of floats (same length), as [group.size][n] float64 (bit-exact)."""
    n = len(values)
    bits = np.array(values, dtype=np.float64).view(np.int64)
    out = td.zeros(group.size * n, dtype=td.int64)
    group.all_gather(out, td.tensor(bits.tolist(), dtype=td.int64))
    return np.array(out.tolist(), dtype=np.int64).view(np.float64).reshape(group.size, n)


def gather_flat(t, group):
    """all_gather of a tensor over `group`: [group.size] numpy float64 arrays of t's shape."""
    t = t.detach().contiguous()
    out = td.zeros(group.size * t.numel(), dtype=t.dtype)
    group.all_gather(out, t.reshape(-1))
    return [arr(out.narrow(0, r * t.numel(), t.numel()).reshape(list(t.shape)))
            for r in range(group.size)]


def full_parameters(model, grid, grads=False):
    """name -> the full (tp=1, unpadded) parameter (or its gradient) as numpy, assembled from the
    tp shards with the shard specs. Checks on the way that replicated ones are bitwise equal over
    tp and that every shard is bitwise equal over dp. Collective over the whole grid."""
    tp, dp = grid.tp(), grid.dp()
    out = {}
    for name, p in model.named_parameters():
        spec = model.shard_spec(name)
        p = p.grad if grads else p
        for r, other in enumerate(gather_flat(p, dp)):
            check(np.array_equal(other, arr(p)), f"{name}: dp replica {r} differs")
        shards = gather_flat(p, tp)
        if spec["dim"] < 0:
            for r, s in enumerate(shards):
                check(np.array_equal(s, arr(p)), f"replicated {name} differs on tp rank {r}")
            out[name] = arr(p)
            continue
        full = td.zeros(*spec["full_shape"])
        for r, s in enumerate(shards):
            put_shard(td.tensor(s, dtype=td.float32), dict(spec, index=r), full)
        out[name] = arr(full)
    return out


# ---- the one-process reference (rank 0) ----

_REFERENCE = {}


def reference(cfg, data):
    """(losses, grad norms, final parameters) of one process training cfg on data."""
    key = (repr(cfg), len(data[0][0]))
    if key in _REFERENCE:
        return _REFERENCE[key]
    model = td.models.GPT(cfg)
    model.train()
    params = list(model.parameters())
    opt = td.optim.AdamW(model.param_groups(WD), lr=LR, betas=BETAS, eps=EPS)
    losses, norms, grads = [], [], None
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = model(ids(x), ids(y))
        loss.backward()
        norms.append(td.nn.utils.clip_grad_norm_(params, CLIP).item())
        if grads is None:
            grads = {n: arr(p.grad) for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    final = {n: arr(p) for n, p in model.named_parameters()}
    _REFERENCE[key] = (np.array(losses), np.array(norms), grads, final)
    return _REFERENCE[key]


# ---- the parallel run ----

def train_parallel(grid, cfg, data, sp, zero=False, steps=STEPS):
    """Trains cfg over grid for `steps` steps; returns (model, losses, norms, grads) where losses
    are the global-batch losses (the mean of the dp ranks' micro-batch losses, float64) and
    grads the full clipped gradients of step 1 (full_parameters; None under ZeRO-1, whose
    gradients are sharded over dp)."""
    tp_size = grid.dims.tp
    d = grid.coords.dp
    model = td.models.GPT(cfg)
    parallelize(model, grid, sequence_parallel=sp)
    check(model.tp_size == tp_size and model.tp_rank == grid.coords.tp, "tp_size / tp_rank")
    check(model.sequence_parallel == sp, "sequence_parallel flag")
    model.train()
    ddp = dist.DistributedDataParallel(model, group=grid.dp(), bucket_mb=0.01, zero=zero)
    if zero:
        opt = dist.DistributedOptimizer(ddp, model.param_groups(WD), lr=LR, betas=BETAS, eps=EPS)
        opt.set_model_parallel(model, grid.tp())
    else:
        opt = td.optim.AdamW(model.param_groups(WD), lr=LR, betas=BETAS, eps=EPS)
    losses, norms, grads = [], [], None
    for x, y in data[:steps]:
        ddp.zero_grad()
        rows = slice(d * MICRO, (d + 1) * MICRO)
        loss = ddp(ids(x[rows]), ids(y[rows]))
        loss.backward()
        ddp.finish_grad_sync()
        norms.append(opt.clip_grad_norm(CLIP) if zero else clip_grad_norm_(model, CLIP, grid.tp()))
        if not zero and grads is None:
            grads = full_parameters(model, grid, grads=True)
        opt.step()
        losses.append(loss.item())
    every = gather_floats(losses + norms, grid.dp())
    check(np.all(every[:, steps:] == every[0, steps:]), "grad norms differ over dp")
    tp_every = gather_floats(losses + norms, grid.tp())
    check(np.all(tp_every == tp_every[0]), "losses or grad norms differ over tp")
    return model, every[:, :steps].mean(axis=0), np.array(norms), grads


def check_training(W, me, tp, arch, sp, zero=False):
    dp = W // tp
    grid = dist.ProcessGrid(dist.world(), dist.ParallelDims(tp=tp, dp=dp))
    cfg = config(arch, kv=tp)
    data = batches(dp * MICRO)
    model, losses, norms, grads = train_parallel(grid, cfg, data, sp, zero)
    full = full_parameters(model, grid)
    tag = f"{arch} tp{tp}xdp{dp} sp={int(sp)} zero={int(zero)}"
    if me == 0:
        ref_losses, ref_norms, ref_grads, ref_final = reference(cfg, data)
        check(np.any(ref_norms > CLIP), f"{tag}: clipping never active (norms {ref_norms})")
        loss_rel = np.max(np.abs(losses - ref_losses) / np.abs(ref_losses))
        norm_rel = np.max(np.abs(norms - ref_norms) / ref_norms)
        check(loss_rel <= LOSS_REL, f"{tag}: losses {losses} != one rank {ref_losses} "
                                    f"(max rel {loss_rel:.2e})")
        check(norm_rel <= NORM_REL, f"{tag}: grad norms {norms} != one rank {ref_norms} "
                                    f"(max rel {norm_rel:.2e})")
        check(sorted(full) == sorted(ref_final), f"{tag}: parameter names differ")
        grad_rel = 0.0
        for name, want in (ref_grads.items() if grads is not None else ()):
            got = grads[name]
            check(got.shape == want.shape, f"{tag}: grad {name} shape {got.shape} != {want.shape}")
            err = float(np.max(np.abs(got - want))) / float(np.max(np.abs(want)))
            check(err <= GRAD_REL, f"{tag}: step-1 gradient of {name} differs by {err:.2e} of "
                                   "its largest element")
            grad_rel = max(grad_rel, err)
        worst, moved = 0.0, 0.0
        init = {n: arr(p) for n, p in td.models.GPT(cfg).named_parameters()}
        for name, want in ref_final.items():
            got = full[name]
            check(got.shape == want.shape, f"{tag}: {name} shape {got.shape} != {want.shape}")
            err = float(np.max(np.abs(got - want)))
            check(err <= PARAM_ATOL, f"{tag}: final {name} differs by {err:.2e}")
            worst = max(worst, err)
            moved = max(moved, float(np.max(np.abs(want - init[name]))))
        gr = f"{grad_rel:.1e}" if grads is not None else "- (ZeRO-1)"
        log(f"train {tag}: loss rel {loss_rel:.1e} norm rel {norm_rel:.1e} grad rel {gr} "
            f"param abs {worst:.1e} "
            f"(moved {moved:.1e}) norms {np.round(ref_norms, 3).tolist()} "
            f"losses {np.round(ref_losses, 5).tolist()}")
    dist.barrier()


# ---- dropout ----

def check_dropout(W, me):
    """With dropout 0.1 and sequence parallelism two fresh runs give bitwise identical losses
    (the dropout streams restart from the seed) and differ from the dropout-0 run (dropout is
    on). Without sp every dropout acts on activations replicated over tp, drawn from the model's
    own stream, so tp=W reproduces the one-rank dropout run to fp32 rounding. The split stream
    differs on every tp rank, the model's own stream does not."""
    tp = W if W <= 4 else 4
    grid = dist.ProcessGrid(dist.world(), dist.ParallelDims(tp=tp, dp=W // tp))
    data = batches((W // tp) * MICRO)
    steps = 2
    # The streams (Note [Which stream] in parallel/rng_tracker.h): the split one differs on
    # every tp rank (masks of sequence chunks are independent), the model's own is the same.
    model = parallelize(td.models.GPT(config("gpt2", kv=tp, dropout=0.1)), grid,
                        sequence_parallel=True)
    split = gather_flat(td.rand(64, generator=model.split_generator), grid.tp())
    own = gather_flat(td.rand(64, generator=model.dropout_generator), grid.tp())
    for r in range(tp):
        check(np.array_equal(own[r], own[0]), f"dropout stream differs on tp rank {r}")
        check(r == grid.coords.tp or not np.array_equal(split[r], split[grid.coords.tp]),
              f"split dropout stream of tp rank {r} equals this rank's")
    for arch in ("gpt2", "llama"):
        drop = config(arch, kv=tp, dropout=0.1)
        a = train_parallel(grid, drop, data, sp=True, steps=steps)[1]
        b = train_parallel(grid, drop, data, sp=True, steps=steps)[1]
        c = train_parallel(grid, config(arch, kv=tp), data, sp=True, steps=steps)[1]
        check(np.array_equal(a, b), f"{arch} dropout sp: runs differ {a} vs {b}")
        rel = np.abs(a - c) / np.abs(c)
        check(np.all(rel > 1e-4), f"{arch} dropout sp: loss {a} equals the dropout-0 loss {c}")
        nosp = train_parallel(grid, drop, data, sp=False, steps=steps)[1]
        if me == 0:
            one = td.models.GPT(drop)
            one.train()
            x, y = data[0]
            # The one-rank loss at step 1 (forward only: no update yet) on the global batch.
            ref = one(ids(x), ids(y)).item()
            rel_nosp = abs(nosp[0] - ref) / abs(ref)
            check(rel_nosp <= LOSS_REL, f"{arch} dropout tp{tp} without sp: step-1 loss "
                                        f"{nosp[0]} != one rank {ref}")
            log(f"dropout {arch} tp{tp}: sp runs {a.tolist()} == {b.tolist()}; dropout 0 "
                f"{c.tolist()} (rel diff >= {rel.min():.1e}); no-sp step 1 vs one rank "
                f"rel {rel_nosp:.1e}")
    dist.barrier()


# ---- memory ----

def expected_local_parameters(cfg, tp, mult=128):
    """The parameters one rank holds under tp (the formula of Note [GPT tensor-parallel
    layout]): split matrices and their biases / tp, the padded vocabulary rows / tp, every norm
    weight, wpe and row-parallel bias whole."""
    d, L, ff = cfg.d_model, cfg.n_layer, cfg.ffn_hidden
    hd = d // cfg.n_head
    vpad = -(-cfg.vocab_size // (mult * tp)) * mult * tp if tp > 1 else cfg.vocab_size
    if cfg.arch == "gpt2":
        split = L * (3 * d * d + 3 * d + d * d + ff * d + ff + d * ff)  # c_attn w+b, proj, fc w+b
        repl = cfg.block_size * d + L * (4 * d + 2 * d) + 2 * d  # wpe, ln_1/2 w+b, proj biases
        return vpad * d // tp + split // tp + repl                # tied wte/lm_head once
    kv = cfg.n_kv_head
    split = L * ((cfg.n_head + 2 * kv) * hd * d + d * d + 2 * ff * d + d * ff)
    repl = L * 2 * d + d  # ln_1, ln_2, ln_f weights (RMSNorm, no bias)
    return 2 * vpad * d // tp + split // tp + repl  # untied wte and lm_head


def check_parameter_counts(W, me):
    """local_num_parameters() equals the formula exactly for every tp this world allows, and
    num_parameters() stays the full model's (unpadded) count."""
    for tp in (t for t in (2, 4) if W % t == 0):
        grid = dist.ProcessGrid(dist.world(), dist.ParallelDims(tp=tp, dp=W // tp))
        for arch in ("gpt2", "llama"):
            for mult in (128, 1):
                cfg = config(arch, kv=tp)
                model = td.models.GPT(cfg)
                full = model.num_parameters()
                check(full == expected_local_parameters(cfg, 1),
                      f"{arch}: num_parameters {full} != formula")
                parallelize(model, grid, make_vocab_size_divisible_by=mult)
                got, want = model.local_num_parameters(), expected_local_parameters(cfg, tp, mult)
                check(got == want, f"{arch} tp{tp} multiple {mult}: local_num_parameters {got} "
                                   f"!= formula {want}")
                check(model.num_parameters() == full, f"{arch} tp{tp}: num_parameters changed")
                check(sum(p.numel() for p in model.parameters()) == got,
                      f"{arch} tp{tp}: parameters() numel != local_num_parameters")
                log(f"params {arch} tp{tp} multiple {mult}: full {full} local {got}")
    dist.barrier()


def activation_peak(grid, cfg, sp, x, y):
    """Peak bytes allocated above the steady state (parameters + their gradients) during one
    forward + backward on this rank's data (x, y numpy [B, T])."""
    model = td.models.GPT(cfg)
    parallelize(model, grid, sequence_parallel=sp)
    model.train()
    model(ids(x), ids(y)).backward()  # allocates every .grad; later backwards accumulate
    before = td.memory_stats()["current_bytes"]
    td.reset_peak_memory_stats()
    model(ids(x), ids(y)).backward()
    return td.memory_stats()["peak_bytes"] - before


def check_activation_memory(W, me):
    """Sequence parallelism lowers the activation memory of one forward + backward.

    What sp splits along T (Note [GPT tensor-parallel layout]): the residual stream and the
    norm/dropout region between the layers. Per layer, each of the two norms keeps its input
    [B, T, d] for backward, which is [B, T/tp, d] under sp; the gathered norm output that a
    column-parallel layer keeps for its weight gradient is [B, T, d] either way, and the
    attention and MLP activations ([B, T, heads/tp ...], [B, T, ffn/tp]) do not change. So
    with sp the activations saved for backward, all alive at the end of forward where the peak
    is (the head's logits come on top of them), are smaller by at least 2 x L [B, T, d] fp32
    tensors x (1 - 1/tp), which the test requires; the row-parallel outputs (reduce-scattered
    instead of all-reduced) and the residual adds save more, which the margin does not count.
    Measured at tp 2 (L 2, B 4, T 64, d 128; unit [B, T, d] = 128 KiB): gpt2 4,737,408 ->
    3,814,784 bytes (7.0 units saved), llama 5,191,040 -> 4,661,568 (4.0 units); required 2
    units. d and T are large and the vocabulary small so that these activations, not the head,
    dominate."""
    tp = 2
    grid = dist.ProcessGrid(dist.world(), dist.ParallelDims(tp=tp, dp=W // tp))
    B, T = 4, 64
    for arch in ("gpt2", "llama"):
        cfg = config(arch, kv=tp, d_model=128, block_size=T, ffn_hidden=512, n_layer=2,
                     vocab_size=VOCAB)
        x, y = batches(B, seq=T, steps=1)[0]
        off = activation_peak(grid, cfg, False, x, y)
        on = activation_peak(grid, cfg, True, x, y)
        unit = B * T * cfg.d_model * 4
        margin = 2 * cfg.n_layer * unit * (1 - 1 / tp)
        check(on > 0 and off - on >= margin,
              f"{arch}: sp activation peak {on} not below {off} by {margin:.0f} bytes")
        log(f"memory {arch} tp{tp} B{B} T{T} d{cfg.d_model}: activation peak without sp {off} "
            f"with sp {on} bytes (saved {off - on} = {(off - on) / unit:.2f} x [B,T,d]; "
            f"required {margin:.0f})")
    dist.barrier()


def main():
    dist.init(timeout_s=60)
    W, me = dist.world_size(), dist.rank()
    layouts = {2: [2], 4: [2, 4], 8: [4, 2]}[W]
    try:
        check_parameter_counts(W, me)
        for tp in layouts:
            for arch in ("gpt2", "llama"):
                for sp in (False, True):
                    check_training(W, me, tp, arch, sp)
        if W == 4:
            check_training(W, me, 2, "llama", True, zero=True)
            check_training(W, me, 2, "gpt2", False, zero=True)
        if W <= 4:
            check_dropout(W, me)
        if W == 2:
            check_activation_memory(W, me)
    except Exception:  # noqa: BLE001 - report which check failed on which rank, then fail
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        dist._D.abort_world(1)
    dist.barrier()
    log(f"OK {W}")
    dist.destroy()


if __name__ == "__main__":
    main()
