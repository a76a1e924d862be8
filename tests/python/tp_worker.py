"""One rank of the tensor-parallel checks of test_tensor_parallel.py (run through tardelli.launch).

tp = the world. Every rank seeds the same generator state, builds the parallel layer AND the
unsplit td.nn layer from it, and compares the parallel output and gradients with the matching
slices of the unsplit ones (numpy float64 on this rank). The loss is sum(y * G) for a fixed G;
for an output split over tp each rank takes its part of G, so each shard's gradient must equal
its slice of the unsplit gradient. The program exits non-zero on the first failed check (after
printing it); rank 0 prints "TP OK <world size>" when every rank passed.

Tolerances: bitwise for the init (the shards are slices of the very same draw) and for the
column-parallel output (each output column is the same dot product over the full input, at the
shapes used); 1e-5
of the largest magnitude otherwise: sums re-associated over ranks or by a shard-shaped GEMM, fp32
sums of <= 32 O(1) terms (rounding ~2e-6 at worst), while a wrong slice or reduction is O(1).
"""
import sys
import traceback

import numpy as np

import tardelli as td
import tardelli.distributed as dist
import tardelli.nn.functional as F

REL = 1e-5
D0, D1 = 4, 8  # leading dims of every input: both divide by 2 and 4


def arr(t):
    return np.array(t.detach().float().numpy(), dtype=np.float64)


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {dist.rank()}: {what}")


def close(got, want, what, rel=REL):
    got = arr(got) if isinstance(got, td.Tensor) else np.asarray(got, dtype=np.float64)
    want = arr(want) if isinstance(want, td.Tensor) else np.asarray(want, dtype=np.float64)
    check(got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}")
    err = np.max(np.abs(got - want)) if got.size else 0.0
    tol = rel * np.max(np.abs(want), initial=0.0)
    check(err <= tol, f"{what}: max error {err} > {tol}" + ("" if rel else " (bitwise)"))


def chunk(a, dim, n, r):
    """Rank r's chunk of dim `dim` of a numpy array (or tensor) split n ways."""
    a = arr(a) if isinstance(a, td.Tensor) else a
    k = a.shape[dim] // n
    return np.take(a, range(r * k, (r + 1) * k), axis=dim)


def seeded(shape, seed):
    return td.randn(*shape, generator=td.Generator(seed))


def leaf(a):
    t = a.detach().clone() if isinstance(a, td.Tensor) else td.tensor(np.ascontiguousarray(a),
                                                                      dtype=td.float32)
    return t.requires_grad_(True)


def raises(fn, *names):
    try:
        fn()
    except td.TardelliError as e:
        msg = str(e)
        for name in names:
            check(name in msg, f"error '{msg}' does not name {name!r}")
        return
    check(False, f"expected a TardelliError naming {names}")


# ---- linear layers ----

def check_column(W, me):
    # out = 8: the full GEMM and the shards' stay on oneDNN kernels that compute each column as
    # the same FMA chain, so the output is bitwise (Note [Bitwise column output] in
    # tests/distributed/test_parallel_layers.cpp: at out = 16 it differs by 1 ulp).
    fin, fout = 12, 8
    x, G = seeded((D0, D1, fin), 1), seeded((D0, D1, fout), 2)
    td.manual_seed(101)
    dense = td.nn.Linear(fin, fout)
    xd = leaf(x)
    yd = dense(xd)
    (yd * G).sum().backward()

    def run(**kw):
        td.manual_seed(101)  # the same default-generator state as the dense layer's
        layer = dist.ColumnParallelLinear(fin, fout, **kw)
        sp, dim = kw.get("sequence_parallel", False), kw.get("seq_dim", 0)
        xp = leaf(chunk(x, dim, W, me) if sp else x)
        y = layer(xp)
        g = G if kw.get("gather_output") else td.tensor(chunk(G, 2, W, me), dtype=td.float32)
        (y * g).sum().backward()
        return layer, y, xp.grad

    layer, y, dx = run()
    check(tuple(layer.weight.shape) == (fout // W, fin), "column weight shape")
    close(layer.weight, chunk(dense.weight, 0, W, me), "column init == Linear rows", rel=0)
    close(layer.bias, chunk(dense.bias, 0, W, me), "column bias init", rel=0)
    close(y, chunk(yd, 2, W, me), "column y", rel=0)
    close(layer.weight.grad, chunk(dense.weight.grad, 0, W, me), "column dW")
    close(layer.bias.grad, chunk(dense.bias.grad, 0, W, me), "column db")
    close(dx, xd.grad, "column dx")
    base_y, base_dx = arr(y), arr(dx)

    layer, y, dx = run(gather_output=True)
    close(y, yd, "column gather_output y", rel=0)
    close(dx, xd.grad, "column gather_output dx")
    close(layer.weight.grad, chunk(dense.weight.grad, 0, W, me), "column gather_output dW")
    for dim in (0, 1):
        layer, y, dx = run(sequence_parallel=True, seq_dim=dim)
        close(y, base_y, f"column sequence_parallel seq_dim {dim} y == off", rel=0)
        close(dx, chunk(base_dx, dim, W, me), f"column sequence_parallel seq_dim {dim} dx == off")
        close(dx, chunk(xd.grad, dim, W, me), f"column sequence_parallel seq_dim {dim} dx")
        close(layer.weight.grad, chunk(dense.weight.grad, 0, W, me),
              f"column sequence_parallel seq_dim {dim} dW")
        close(layer.bias.grad, chunk(dense.bias.grad, 0, W, me),
              f"column sequence_parallel seq_dim {dim} db")

    # An explicit generator in the state of the default one after manual_seed(101) draws the
    # same layer; from_full slices an existing one identically.
    g = dist.ColumnParallelLinear(fin, fout, generator=td.Generator(101))
    close(g.weight, chunk(dense.weight, 0, W, me), "column init from a generator", rel=0)
    f = dist.ColumnParallelLinear.from_full(dense)
    close(f.weight, chunk(dense.weight, 0, W, me), "column from_full", rel=0)
    close(f.bias, chunk(dense.bias, 0, W, me), "column from_full bias", rel=0)
    check(f.tp_size == W and f.tp_rank == me, "column tp_size / tp_rank")
    nb = dist.ColumnParallelLinear(fin, fout, bias=False)
    check(nb.bias is None and [n for n, _ in nb.named_parameters()] == ["weight"],
          "column without bias")


def check_row(W, me):
    fin, fout = 16, 12
    x, G = seeded((D0, D1, fin), 3), seeded((D0, D1, fout), 4)
    td.manual_seed(202)
    dense = td.nn.Linear(fin, fout)
    xd = leaf(x)
    yd = dense(xd)
    (yd * G).sum().backward()

    def run(**kw):
        td.manual_seed(202)
        layer = dist.RowParallelLinear(fin, fout, **kw)
        sp, dim = kw.get("sequence_parallel", False), kw.get("seq_dim", 0)
        xp = leaf(chunk(x, 2, W, me) if kw.get("input_is_parallel", True) else x)
        y = layer(xp)
        (y * (td.tensor(chunk(G, dim, W, me), dtype=td.float32) if sp else G)).sum().backward()
        return layer, y, xp.grad

    layer, y, dx = run()
    check(tuple(layer.weight.shape) == (fout, fin // W), "row weight shape")
    close(layer.weight, chunk(dense.weight, 1, W, me), "row init == Linear columns", rel=0)
    close(layer.bias, dense.bias, "row bias init (replicated)", rel=0)
    close(y, yd, "row y")
    close(layer.weight.grad, chunk(dense.weight.grad, 1, W, me), "row dW")
    close(layer.bias.grad, dense.bias.grad, "row db")
    close(dx, chunk(xd.grad, 2, W, me), "row dx")
    base_y = arr(y)

    layer, y, dx = run(input_is_parallel=False)
    close(y, yd, "row split-input y")
    close(dx, xd.grad, "row split-input dx")
    for dim in (0, 1):
        layer, y, dx = run(sequence_parallel=True, seq_dim=dim)
        close(y, chunk(base_y, dim, W, me), f"row sequence_parallel seq_dim {dim} y == off")
        close(y, chunk(yd, dim, W, me), f"row sequence_parallel seq_dim {dim} y")
        close(dx, chunk(xd.grad, 2, W, me), f"row sequence_parallel seq_dim {dim} dx")
        close(layer.weight.grad, chunk(dense.weight.grad, 1, W, me),
              f"row sequence_parallel seq_dim {dim} dW")
        close(layer.bias.grad, dense.bias.grad, f"row sequence_parallel seq_dim {dim} db")

    f = dist.RowParallelLinear.from_full(dense)
    close(f.weight, chunk(dense.weight, 1, W, me), "row from_full", rel=0)
    close(f.bias, dense.bias, "row from_full bias", rel=0)


def check_mlp(W, me):
    """Column -> GELU -> row equals the dense 2-layer MLP, with and without sequence
    parallelism (on [s, b, h] with seq_dim 0 and on [b, s, h] with seq_dim 1)."""
    h, ffn = 8, 16
    x, G = seeded((D0, D1, h), 5), seeded((D0, D1, h), 6)
    td.manual_seed(303)
    fc1, fc2 = td.nn.Linear(h, ffn), td.nn.Linear(ffn, h)
    xd = leaf(x)
    yd = fc2(F.gelu(fc1(xd)))
    (yd * G).sum().backward()
    for sp, dim in ((False, 0), (True, 0), (True, 1)):
        td.manual_seed(303)
        c1 = dist.ColumnParallelLinear(h, ffn, sequence_parallel=sp, seq_dim=dim)
        c2 = dist.RowParallelLinear(ffn, h, sequence_parallel=sp, seq_dim=dim)
        xp = leaf(chunk(x, dim, W, me) if sp else x)
        y = c2(F.gelu(c1(xp)))
        (y * (td.tensor(chunk(G, dim, W, me), dtype=td.float32) if sp else G)).sum().backward()
        tag = f"mlp sequence_parallel={sp} seq_dim={dim}"
        close(y, chunk(yd, dim, W, me) if sp else yd, tag + " y")
        close(xp.grad, chunk(xd.grad, dim, W, me) if sp else xd.grad, tag + " dx")
        close(c1.weight.grad, chunk(fc1.weight.grad, 0, W, me), tag + " dW1")
        close(c1.bias.grad, chunk(fc1.bias.grad, 0, W, me), tag + " db1")
        close(c2.weight.grad, chunk(fc2.weight.grad, 1, W, me), tag + " dW2")
        close(c2.bias.grad, fc2.bias.grad, tag + " db2")


# ---- vocabulary ----

def padded_rows(a, padded):
    out = np.zeros((padded,) + a.shape[1:])
    out[:a.shape[0]] = a
    return out


def make_ids(V, seed, shape):
    ids = td.randint(0, V, shape, generator=td.Generator(seed)).numpy().reshape(-1).copy()
    ids[0], ids[1], ids[2] = 0, V - 1, ids[5]
    return td.tensor(ids.reshape(shape).tolist(), dtype=td.int64)


def check_embedding(W, me):
    dim = 8
    for V, mult in ((1000, 128), (1001, 1)):
        padded = dist.padded_vocab_size(V, W, mult)
        check(padded == -(-V // (mult * W)) * mult * W and padded != V,
              f"padded_vocab_size({V}, {W}, {mult}) = {padded}")
        ids, G = make_ids(V, 7, (D0, D1)), seeded((D0, D1, dim), 8)
        td.manual_seed(500 + V)
        dense = td.nn.Embedding(V, dim)
        yd = dense(ids)
        (yd * G).sum().backward()
        rows = padded // W
        tag = f"embedding V={V} padded={padded}"
        for sp, sd in ((False, 0), (True, 0), (True, 1)):
            td.manual_seed(500 + V)
            e = dist.VocabParallelEmbedding(V, dim, sequence_parallel=sp, seq_dim=sd,
                                            make_divisible_by=mult)
            check(e.padded_vocab == padded and e.vocab_start == me * rows and
                  e.vocab_end == (me + 1) * rows, tag + " range")
            want_w = chunk(padded_rows(arr(dense.weight), padded), 0, W, me)
            close(e.weight, want_w, tag + " init == Embedding rows (padding zero)", rel=0)
            y = e(ids)
            (y * (td.tensor(chunk(G, sd, W, me), dtype=td.float32) if sp else G)).sum().backward()
            t = tag + f" sequence_parallel={sp} seq_dim={sd}"
            close(y, chunk(yd, sd, W, me) if sp else yd, t + " y", rel=0)
            close(e.weight.grad, chunk(padded_rows(arr(dense.weight.grad), padded), 0, W, me),
                  t + " dW (zero on padding)", rel=0)
        f = dist.VocabParallelEmbedding.from_full(dense, make_divisible_by=mult)
        close(f.weight, e.weight, tag + " from_full", rel=0)
        # Ids in the padding range are out of range, as in td.nn.Embedding.
        raises(lambda: f(td.tensor([0, V], dtype=td.int64)), "VocabParallelEmbedding")


def check_cross_entropy(W, me):
    """vocab_parallel_cross_entropy equals F.cross_entropy of the unpadded logits, loss and the
    shard's gradient (zero on padding columns, whose logits are a large 30), with ignore_index
    and every reduction, for a padded vocabulary and an unpadded one."""
    N = 13
    for V, mult in ((1001, 1), (1000, 128), (64, 1)):
        padded = dist.padded_vocab_size(V, W, mult)
        logits = seeded((N, V), 41) * 3.0
        tg = td.randint(0, V, (N,), generator=td.Generator(42)).numpy().copy()
        tg[0], tg[1] = V - 1, 0
        tg[2::4] = -100
        target = td.tensor(tg.tolist(), dtype=td.int64)
        full = np.full((N, padded), 30.0)
        full[:, :V] = arr(logits)
        for reduction in ("mean", "sum", "none"):
            wts = seeded((N,), 43) if reduction == "none" else td.ones(())
            ld = leaf(logits)
            lossd = F.cross_entropy(ld, target, reduction=reduction)
            (lossd * wts).sum().backward()
            shard = leaf(chunk(full, 1, W, me))
            loss = dist.vocab_parallel_cross_entropy(shard, target, V, reduction=reduction)
            (loss * wts).sum().backward()
            tag = f"cross_entropy V={V} padded={padded} {reduction}"
            close(loss, lossd, tag + " loss")
            want = chunk(padded_rows(arr(ld.grad).T, padded).T, 1, W, me)
            close(shard.grad, want, tag + " d logits (zero on padding)", rel=1e-5)
            if padded > V and me == W - 1:
                check(np.all(arr(shard.grad)[:, V - me * (padded // W):] == 0),
                      tag + " padding columns got gradient")


def check_tied_ends(W, me):
    """A GPT's two ends: VocabParallelEmbedding, its weight as the column-parallel output
    projection, and the vocab-parallel loss equal Embedding + linear + cross_entropy in the loss
    and the table gradient (both paths), for V = 1001 (padded)."""
    V, dim = 1001, 8
    ids = make_ids(V, 9, (D0, D1))
    tg = make_ids(V, 10, (D0 * D1,)).numpy().copy()
    tg[3::5] = -100
    target = td.tensor(tg.tolist(), dtype=td.int64)
    td.manual_seed(606)
    dense = td.nn.Embedding(V, dim)
    hd = dense(ids)
    lossd = F.cross_entropy(F.linear(hd, dense.weight).reshape(D0 * D1, V), target)
    lossd.backward()
    td.manual_seed(606)
    e = dist.VocabParallelEmbedding(V, dim, make_divisible_by=1)
    logits = dist.tensor_parallel.column_parallel_linear(e(ids), e.weight)
    loss = dist.vocab_parallel_cross_entropy(logits.reshape(D0 * D1, logits.shape[-1]), target, V)
    loss.backward()
    close(loss, lossd, "tied ends loss")
    close(e.weight.grad, chunk(padded_rows(arr(dense.weight.grad), e.padded_vocab), 0, W, me),
          "tied ends dW")


# ---- rng tracker, errors ----

def check_rng_tracker(W, me):
    tr = dist.RngTracker.model_parallel(1234, me)
    check(sorted(tr.names()) == [dist.tensor_parallel.DEFAULT_RNG,
                                 dist.tensor_parallel.MODEL_PARALLEL_RNG], "tracker names")
    saved = tr.states()
    rep = td.rand(64, generator=tr.get(dist.tensor_parallel.DEFAULT_RNG))
    mp = td.rand(64, generator=tr.fork())
    every = [td.zeros(2, 64) for _ in range(W)]
    dist.all_gather(every, td.stack([rep, mp]))
    for r in range(W):
        close(every[r][0], rep, f"default stream identical on rank {r}", rel=0)
        if r != me:
            check(np.any(arr(every[r][1]) != arr(mp)), f"model-parallel stream of rank {r} differs")
    tr.set_states(saved)  # restoring the states replays the draws
    close(td.rand(64, generator=tr.get(dist.tensor_parallel.DEFAULT_RNG)), rep,
          "set_states replays", rel=0)
    raises(lambda: tr.get("nope"), "nope")


def check_errors(W, me):
    odd = 4 * W + 1  # divisible by neither 2 nor 4
    raises(lambda: dist.ColumnParallelLinear(8, odd), "ColumnParallelLinear", "not divisible")
    raises(lambda: dist.RowParallelLinear(odd, 8), "RowParallelLinear", "not divisible")
    raises(lambda: dist.ColumnParallelLinear(8, 8, gather_output=True, sequence_parallel=True),
           "ColumnParallelLinear")
    raises(lambda: dist.RowParallelLinear(8, 8, input_is_parallel=False, sequence_parallel=True),
           "RowParallelLinear")
    c = dist.ColumnParallelLinear(8, 4 * W)
    raises(lambda: c(td.ones(2, 7)), "ColumnParallelLinear")
    raises(lambda: dist.RowParallelLinear(4 * W, 8)(td.ones(2, 4 * W)), "RowParallelLinear")
    r = dist.RowParallelLinear(4 * W, 8, sequence_parallel=True)
    raises(lambda: r(td.ones(W + 1, 4)), "divisible")
    # The group still works: no rank entered a collective the others skipped.
    one = td.ones(1)
    dist.all_reduce(one)
    close(one, [W], "all_reduce after errors", rel=0)


def main():
    dist.init()
    W, me = dist.world_size(), dist.rank()
    checks = [check_column, check_row, check_mlp, check_embedding, check_cross_entropy,
              check_tied_ends, check_rng_tracker, check_errors]
    try:
        for c in checks:
            c(W, me)
    except Exception:  # noqa: BLE001 - report which check failed on which rank, then fail
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        dist._D.abort_world(1)
    dist.barrier()
    if me == 0:
        print(f"TP OK {W} ({W} ranks)", flush=True)
    dist.destroy()


if __name__ == "__main__":
    main()
