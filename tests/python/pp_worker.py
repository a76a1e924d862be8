"""One rank of the pipeline-parallel checks of test_pipeline_parallel.py (issue 8), run through
tardelli.launch at 2, 4 and 8 ranks.

Every run is built only with the library API, as the train CLI does:

    chunks = build_stages(cfg, grid.coords.pp, pp, vpp, layout)   # this rank's model chunks
    (parallelize(chunk, grid, sequence_parallel=True) for tp > 1; a DistributedDataParallel over
     every chunk's parameters for dp > 1, reduced once after the pipeline step)
    pipe = PipelineRuntime(chunks, grid, schedule, m, MICRO, SEQ)
    loss = pipe.step(batches); clip_grad_norm_(chunks, CLIP, grid.group("tp-pp")); AdamW.step()

and every rank compares it with one process training the whole model on the global batch (the
m x dp micro-batches concatenated) with AdamW and td.nn.utils.clip_grad_norm_ (each rank runs
that reference itself: the model is tiny). Checked:
  2 ranks: pp 2 with gpipe, 1f1b, zb, interleaved (vpp 2), gpt2 and llama; uneven layouts
           ([1, 3] with an odd m, [3, 1] under zb); the tied wte copies bitwise equal; the
           measured timeline holds exactly the schedule's actions; bad layouts and bad schedule
           arguments raise clear errors.
  4 ranks: pp 4 with every schedule (interleaved with vpp 2), gpt2 and llama for 1f1b; and
           pp 2 x dp 2 (1f1b, zb) with the DDP.
  8 ranks: tp 2 x pp 2 x dp 2 with sequence parallelism (1f1b gpt2, interleaved llama):
           losses and grad norms.

The program exits non-zero on the first failed check (after printing it on the failing rank);
rank 0 prints one "PP ..." line of measured numbers per run and "PP OK <world size>" when every
rank passed.

Tolerances (fp32 throughout; Adam's eps = 1e-3, as in tp_gpt_worker.py, makes the update
Lipschitz in the gradient so parameters can be compared tightly):
  - loss, relative 1e-5 (the issue's bar): the pipeline computes the same micro-batch losses
    with the same parameters, only the mean over micro-batches (and the reference's one GEMM
    over the whole batch) re-associates sums: ~1e-7 at step 1, later steps carry the parameter
    differences below, which move the loss far less than 1e-5.
  - grad norm, relative 1e-5: a sum of squares of gradients that differ by a few ulps.
  - gradients of every parameter a stage holds (named as in the whole model; the tied wte copy
    on the last stage is compared to the whole model's wte, since after the embedding-group sum
    both copies hold the full gradient), at every step after clipping, relative 1e-5 of the
    tensor's largest element: the pipeline sums the m micro-batches' weight gradients (each
    scaled by 1/m) where the reference has one GEMM over all rows, so the weight-gradient sums
    are re-associated (few ulps of the largest element); steps 2 and 3 start from parameters
    that differ by <= ~1e-7 (below), which changes a gradient by a similar amount. Measured
    <= ~1e-6 (printed). A missing 1/m, a lost micro-batch or a tied-embedding gradient not
    summed is off by O(1).
  - final parameters, absolute 5e-6 = 5e-4 x LR (tp_gpt_worker.py derives the bound: 3 steps
    move a parameter by at most 3 x LR x 3 |dg| / eps for a gradient difference dg); measured
    ~1e-7, while parameters move ~3e-2.
"""
import sys
import traceback

import numpy as np

import tardelli as td
import tardelli.distributed as dist
from tardelli.distributed import pipeline as sched
from tardelli.distributed import clip_grad_norm_, parallelize
from tardelli.distributed.pipeline_parallel import PipelineRuntime, build_stages, stage_layout

VOCAB = 97
SEQ = 8
MICRO = 2
STEPS = 3
LR = 1e-2
WD = 0.1
BETAS = (0.9, 0.95)
EPS = 1e-3
CLIP = 0.3  # below the step-1 norms of these models (checked): clipping is active
LOSS_REL = 1e-5
NORM_REL = 1e-5
GRAD_REL = 1e-5
PARAM_ATOL = 5e-6


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {dist.rank()}: {what}")


def log(msg):
    if dist.rank() == 0:
        print(f"PP {msg}", flush=True)


def arr(t):
    return np.array(t.detach().float().numpy(), dtype=np.float64)


def config(arch, n_layer, **kw):
    base = dict(arch=arch, vocab_size=VOCAB, block_size=SEQ, n_layer=n_layer, n_head=2,
                d_model=16, ffn_hidden=32, dropout=0.0, dtype="fp32", seed=4321)
    if arch == "llama":
        base["n_kv_head"] = 2
    base.update(kw)
    return td.models.GPTConfig(**base)


def make_data(global_batch, steps=STEPS, seed=99):
    """[steps] of (x, y) numpy int64 [global_batch, SEQ]: the same on every rank."""
    g = td.Generator(seed)
    tok = td.randint(0, VOCAB, (steps, global_batch, SEQ + 1), generator=g).numpy()
    return [(tok[s, :, :-1].copy(), tok[s, :, 1:].copy()) for s in range(steps)]


def ids(a):
    return td.tensor(np.ascontiguousarray(a), dtype=td.int64)


def optimizer(models):
    groups = [{"params": [p for m in models for p in m.param_groups(WD)[i]["params"]],
               "weight_decay": WD if i == 0 else 0.0} for i in range(2)]
    return td.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)


# ---- the one-process reference ----

_REFERENCE = {}


def reference(cfg, data):
    """(losses, norms, per-step clipped grads {name: array}, final params) of one process."""
    key = (repr(cfg), len(data[0][0]))
    if key not in _REFERENCE:
        model = td.models.GPT(cfg)
        model.train()
        params = list(model.parameters())
        opt = optimizer([model])
        losses, norms, grads = [], [], []
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss = model(ids(x), ids(y))
            loss.backward()
            norms.append(td.nn.utils.clip_grad_norm_(params, CLIP).item())
            grads.append({n: arr(p.grad) for n, p in model.named_parameters()})
            opt.step()
            losses.append(loss.item())
        final = {n: arr(p) for n, p in model.named_parameters()}
        _REFERENCE[key] = (np.array(losses), np.array(norms), grads, final)
    return _REFERENCE[key]


# ---- the pipeline run ----

def train_pipeline(grid, cfg, kind, m, vpp=1, layout=None, sp=False):
    """Trains cfg over grid with schedule `kind` and m micro-batches per replica for STEPS
    steps. Returns (chunks, pipe, losses (global-batch mean, float64), norms, per-step grads of
    this rank's parameters {name: array})."""
    pp, dp, tp = grid.dims.pp, grid.dims.dp, grid.dims.tp
    chunks = build_stages(cfg, grid.coords.pp, pp, vpp, layout)
    check(len(chunks) == vpp, f"build_stages gave {len(chunks)} chunks for vpp {vpp}")
    if tp > 1:
        for ch in chunks:
            parallelize(ch, grid, sequence_parallel=sp)
    for ch in chunks:
        ch.train()
    named = [(n, p) for ch in chunks for n, p in ch.named_parameters()]
    ddp = dist.DistributedDataParallel(named, group=grid.dp(), bucket_mb=0.01) if dp > 1 \
        else None
    opt = optimizer(chunks)
    pipe = PipelineRuntime(chunks, grid, kind, m, MICRO, SEQ)
    data = make_data(m * MICRO * dp)
    d = grid.coords.dp
    mp = grid.group("tp-pp")
    losses, norms, grads = [], [], []
    for x, y in data:
        rows = [slice((d * m + mb) * MICRO, (d * m + mb + 1) * MICRO) for mb in range(m)]
        batches = [(ids(x[r]), ids(y[r])) for r in rows]
        if ddp is not None:
            ddp.zero_grad()
            with ddp.no_sync(True):
                loss = pipe.step(batches)
            ddp.finish_grad_sync()
        else:
            opt.zero_grad(set_to_none=True)
            loss = pipe.step(batches)
        norms.append(clip_grad_norm_(chunks, CLIP, mp))
        grads.append({n: arr(p.grad) for n, p in named if p.grad is not None})
        opt.step()
        losses.append(loss)
    if dp > 1:  # the global batch's loss: the mean over the replicas' (equal-sized) batches
        losses = gather_floats(losses, grid.dp()).mean(axis=0)
    return chunks, pipe, data, np.array(losses), np.array(norms), grads


def check_timeline(pipe, kind, m, vpp):
    """The measured timeline of the last step holds exactly this rank's scheduled actions, in
    order, each with end >= start; zb has split backwards (I and W), the others full ones."""
    got = [(k, mb, c) for k, mb, c, _, _ in pipe.timeline]
    want = [tuple(a) for a in pipe.schedule.actions[pipe.rank]]
    check(got == want, f"{kind}: timeline actions {got[:6]}... != schedule {want[:6]}...")
    check(len(got) == (3 if kind == "zb" else 2) * m * vpp,
          f"{kind}: {len(got)} actions for m {m} vpp {vpp}")
    check(all(e[4] >= e[3] for e in pipe.timeline), f"{kind}: an action ends before it starts")
    kinds = {k for k, *_ in got}
    check(kinds == ({"F", "I", "W"} if kind == "zb" else {"F", "B"}), f"{kind}: kinds {kinds}")
    timelines = pipe.gather_timelines()  # a collective over the pp group
    b = sched.bubble_fraction(timelines)
    check(0.0 <= b < 1.0, f"{kind}: measured bubble fraction {b}")
    check(len(timelines) == pipe.pp and timelines[pipe.rank] ==
          [tuple(e) for e in pipe.timeline], f"{kind}: gather_timelines lost this rank's events")
    return b


def check_tied_embedding(chunks, pipe, tag):
    """gpt2: the first stage's wte and the last stage's copy are bitwise equal after training
    (both took the same summed gradient and the same AdamW update)."""
    wte = [p for ch in chunks for n, p in ch.named_parameters() if n == "wte.weight"]
    if pipe.embedding_group is None:
        check(not wte, f"{tag}: a rank outside the embedding group holds wte")
        return
    check(len(wte) == 1, f"{tag}: {len(wte)} wte copies on an end stage")
    w = wte[0].detach().contiguous().reshape(-1)
    g = pipe.embedding_group
    out = td.zeros(g.size * w.numel(), dtype=w.dtype)
    g.all_gather(out, w)
    copies = [arr(out.narrow(0, r * w.numel(), w.numel())) for r in range(g.size)]
    check(g.size == 2 and np.array_equal(copies[0], copies[1]),
          f"{tag}: the tied wte copies differ on the first and last stage "
          f"(max {np.max(np.abs(copies[0] - copies[-1])):.2e})")


def check_run(grid, arch, kind, m, vpp=1, layout=None, n_layer=None, sp=False, full=True):
    pp, dp, tp = grid.dims.pp, grid.dims.dp, grid.dims.tp
    cfg = config(arch, n_layer or max(4, pp * vpp))
    chunks, pipe, data, losses, norms, grads = train_pipeline(grid, cfg, kind, m, vpp, layout, sp)
    tag = (f"{arch} {kind} tp{tp}xpp{pp}xdp{dp} m{m} vpp{vpp} sp={int(sp)} "
           f"layout {stage_layout(cfg.n_layer, pp, vpp, layout)}")
    ref_losses, ref_norms, ref_grads, ref_final = reference(cfg, data)
    check(np.any(ref_norms > CLIP), f"{tag}: clipping never active (norms {ref_norms})")
    loss_rel = float(np.max(np.abs(losses - ref_losses) / np.abs(ref_losses)))
    norm_rel = float(np.max(np.abs(norms - ref_norms) / ref_norms))
    check(loss_rel <= LOSS_REL, f"{tag}: losses {losses} != one rank {ref_losses} "
                                f"(max rel {loss_rel:.2e})")
    check(norm_rel <= NORM_REL, f"{tag}: grad norms {norms} != one rank {ref_norms} "
                                f"(max rel {norm_rel:.2e})")
    grad_rel, worst, n_checked = 0.0, 0.0, 0
    if full:  # tp == 1: this rank's parameters are whole, named as in the one-rank model
        names = [n for ch in chunks for n, _ in ch.named_parameters()]
        check(len(set(names)) == len(names), f"{tag}: a parameter name repeats on a rank")
        for step, (got_step, want_step) in enumerate(zip(grads, ref_grads)):
            check(sorted(got_step) == sorted(names), f"{tag}: step {step + 1}: parameters "
                  f"without a gradient: {sorted(set(names) - set(got_step))}")
            for name, got in got_step.items():
                want = want_step[name]
                check(got.shape == want.shape, f"{tag}: grad {name} {got.shape} != {want.shape}")
                err = float(np.max(np.abs(got - want))) / float(np.max(np.abs(want)))
                check(err <= GRAD_REL, f"{tag}: step {step + 1} gradient of {name} differs by "
                                       f"{err:.2e} of its largest element")
                grad_rel = max(grad_rel, err)
                n_checked += 1
        for ch in chunks:
            for name, p in ch.named_parameters():
                err = float(np.max(np.abs(arr(p) - ref_final[name])))
                check(err <= PARAM_ATOL, f"{tag}: final {name} differs by {err:.2e}")
                worst = max(worst, err)
        # Every parameter of the whole model lives on exactly one stage (wte on both ends).
        every = gather_names(names, grid.pp())
        want_names = set(ref_final)
        check(set(every) == want_names, f"{tag}: the stages hold {sorted(set(every))[:5]}... "
                                        f"not the model's parameters")
        counts = {n: every.count(n) for n in want_names}
        tied = {"wte.weight"} if arch == "gpt2" and pp > 1 else set()
        check(all(c == (2 if n in tied else 1) for n, c in counts.items()),
              f"{tag}: parameter placement counts {counts}")
    bubble = check_timeline(pipe, kind, m, vpp)
    if arch == "gpt2":
        check_tied_embedding(chunks, pipe, tag)
    log(f"{tag}: loss rel {loss_rel:.1e} norm rel {norm_rel:.1e}"
        + (f" grad rel {grad_rel:.1e} ({n_checked} tensors x steps) param abs {worst:.1e}"
           if full else "")
        + f" bubble {bubble:.3f} (formula {sched.bubble_formula(kind, pp, m, vpp):.3f}) "
        f"losses {np.round(ref_losses, 5).tolist()}")
    dist.barrier()


def gather_floats(values, group):
    """Every rank's list of floats (same length), as [group.size][n] float64 (bit-exact)."""
    n = len(values)
    bits = np.array(values, dtype=np.float64).view(np.int64)
    out = td.zeros(group.size * n, dtype=td.int64)
    group.all_gather(out, td.tensor(bits.tolist(), dtype=td.int64))
    return np.array(out.tolist(), dtype=np.int64).view(np.float64).reshape(group.size, n)


def gather_names(names, group):
    """Every rank's parameter names over `group`, as one list (a collective)."""
    import json
    data = json.dumps(names).encode()
    n = td.tensor([len(data)], dtype=td.int64)
    sizes = td.zeros(group.size, dtype=td.int64)
    group.all_gather(sizes, n)
    width = int(max(sizes.tolist()))
    buf = td.zeros(width, dtype=td.int64)
    buf[:len(data)] = td.tensor(list(data), dtype=td.int64)
    out = td.zeros(group.size * width, dtype=td.int64)
    group.all_gather(out, buf)
    raw = out.tolist()
    result = []
    for r, size in enumerate(sizes.tolist()):
        result += json.loads(bytes(raw[r * width:r * width + int(size)]).decode())
    return result


def expect_error(fn, exc, *words):
    try:
        fn()
    except exc as e:
        msg = str(e)
        check(all(w in msg for w in words), f"error {msg!r} does not name {words}")
        return msg
    raise AssertionError(f"rank {dist.rank()}: expected {exc.__name__} naming {words}")


def check_errors(grid):
    """Bad layouts and schedule arguments fail on every rank with a message naming the problem,
    before any communication (so a wrong configuration never hangs the job)."""
    pp = grid.dims.pp
    cfg = config("gpt2", 4)
    expect_error(lambda: build_stages(config("gpt2", 3), 0, 2), ValueError, "3 layers",
                 "not divisible", "layout")
    expect_error(lambda: build_stages(cfg, 0, 2, 1, [1, 2]), ValueError, "[1, 2]", "summing",
                 "4 layers")
    expect_error(lambda: build_stages(cfg, 0, 2, 1, [0, 4]), ValueError, "positive")
    expect_error(lambda: build_stages(cfg, 0, 2, 2, [2, 2]), ValueError, "pp 2 x vpp 2")
    expect_error(lambda: stage_layout(4, 0), ValueError, "pp (0)")
    chunks = build_stages(cfg, grid.coords.pp, pp, 2)
    expect_error(lambda: PipelineRuntime(chunks, grid, "interleaved", 1, MICRO, SEQ),
                 td.TardelliError, "1 micro-batches < 2 pipeline stages")
    expect_error(lambda: PipelineRuntime(chunks, grid, "interleaved", 3, MICRO, SEQ),
                 td.TardelliError, "not a multiple")
    expect_error(lambda: PipelineRuntime(chunks, grid, "1f1b", 4, MICRO, SEQ), ValueError,
                 "one chunk per rank", "interleaved")
    one = build_stages(cfg, grid.coords.pp, pp, 1)
    pipe = PipelineRuntime(one, grid, "1f1b", 4, MICRO, SEQ)
    x = ids(np.zeros((MICRO, SEQ), dtype=np.int64))
    expect_error(lambda: pipe.step([(x, x)] * 3), ValueError, "3 micro-batches", "4")
    log("errors: bad layouts, interleaved m < p / m % p, vpp without interleaved, wrong "
        "micro-batch count all raise")
    dist.barrier()


def main():
    dist.init(timeout_s=60)
    W = dist.world_size()
    world = dist.world()
    try:
        if W == 2:
            grid = dist.ProcessGrid(world, dist.ParallelDims(pp=2))
            check_errors(grid)
            for kind in ("gpipe", "1f1b", "zb"):
                check_run(grid, "gpt2", kind, 4)
                check_run(grid, "llama", kind, 4)
            check_run(grid, "gpt2", "interleaved", 4, vpp=2)
            check_run(grid, "llama", "interleaved", 4, vpp=2)
            check_run(grid, "gpt2", "1f1b", 3, layout=[1, 3], n_layer=4)  # odd m, uneven
            check_run(grid, "llama", "zb", 5, layout=[3, 1], n_layer=4)
            check_run(grid, "gpt2", "interleaved", 2, vpp=2, layout=[2, 1, 1, 1], n_layer=5)
        elif W == 4:
            grid = dist.ProcessGrid(world, dist.ParallelDims(pp=4))
            for kind in ("gpipe", "1f1b", "zb"):
                check_run(grid, "gpt2", kind, 8, n_layer=4)
            check_run(grid, "llama", "1f1b", 6, n_layer=4)
            check_run(grid, "gpt2", "interleaved", 8, vpp=2)
            grid = dist.ProcessGrid(world, dist.ParallelDims(pp=2, dp=2))
            check_run(grid, "gpt2", "1f1b", 4)
            check_run(grid, "llama", "zb", 3)
        elif W == 8:
            grid = dist.ProcessGrid(world, dist.ParallelDims(tp=2, pp=2, dp=2))
            check_run(grid, "gpt2", "1f1b", 4, sp=True, full=False)
            check_run(grid, "llama", "interleaved", 2, vpp=2, sp=True, full=False)
        else:
            raise AssertionError(f"pp_worker.py runs at 2, 4 or 8 ranks, not {W}")
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
