"""One rank of the multi-rank checks of test_distributed.py (run through tardelli.launch).

Every check computes its expected value locally from (rank, world size), so a failure names what
went wrong on which rank. The program exits non-zero on the first failed check (after printing
it); rank 0 prints "ALL OK <world size>" at the end when every rank passed.
"""
import sys
import traceback

import numpy as np

import tardelli as td
import tardelli.distributed as dist


def arr(t):
    return np.asarray(t.to(td.float32).tolist(), dtype=np.float64)


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {dist.rank()}: {what}")


def close(got, want, what, tol=1e-6):
    got, want = arr(got), np.asarray(want, dtype=np.float64)
    check(got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}")
    err = np.max(np.abs(got - want)) if got.size else 0.0
    check(err <= tol * (1 + np.max(np.abs(want), initial=0.0)),
          f"{what}: max error {err}\n got {got}\n want {want}")


def vals(r, n, seed=0):
    """Rank r's data: multiples of 1/4 in [-1, 1] (exact in bfloat16 and in sums)."""
    return ((np.arange(n) * 7 + r * 13 + seed * 5) % 9 - 4) * 0.25


def check_basics(W, me):
    check(dist.is_initialized(), "is_initialized")
    check(dist.world_size() == W and dist.rank() == me, "rank/world_size")
    check(dist.is_main_process() == (me == 0), "is_main_process")
    dist.barrier()


def check_collectives(W, me):
    for dtype in (td.float32, td.bfloat16):
        every = np.stack([vals(r, 6) for r in range(W)])
        for op, ref in (("sum", every.sum(0)), ("avg", every.mean(0)), ("max", every.max(0)),
                        ("min", every.min(0))):
            t = td.tensor(vals(me, 6).tolist(), dtype=dtype)
            check(dist.all_reduce(t, op=op) is None, "blocking all_reduce returns None")
            close(t, ref, f"all_reduce {op} {dtype}", tol=1e-2 if op == "avg" else 1e-6)
    # Non-contiguous tensor (a transposed view) is reduced in place as well.
    base = td.tensor(vals(me, 6).reshape(2, 3).tolist())
    view = base.T
    dist.all_reduce(view)
    close(base, sum(vals(r, 6) for r in range(W)).reshape(2, 3), "all_reduce of a view")
    # async: Work.wait / is_completed
    t = td.ones(1000) * (me + 1)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    check(work.is_completed(), "is_completed after wait")
    close(t, np.full(1000, W * (W + 1) / 2), "async all_reduce")

    # all_gather (list), all_gather_into_tensor, reduce_scatter_tensor
    x = td.tensor(vals(me, 4).tolist())
    outs = [td.zeros(4) for _ in range(W)]
    dist.all_gather(outs, x)
    for r in range(W):
        close(outs[r], vals(r, 4), f"all_gather slot {r}")
    flat = td.zeros(W * 4)
    dist.all_gather_into_tensor(flat, x)
    close(flat, np.concatenate([vals(r, 4) for r in range(W)]), "all_gather_into_tensor")
    inp = td.tensor(vals(me, 3 * W).tolist())
    out = td.zeros(3)
    dist.reduce_scatter_tensor(out, inp)
    total = sum(vals(r, 3 * W) for r in range(W))
    close(out, total[3 * me:3 * me + 3], "reduce_scatter_tensor sum")
    dist.reduce_scatter_tensor(out, inp, op="max")
    close(out, np.max([vals(r, 3 * W) for r in range(W)], 0)[3 * me:3 * me + 3],
          "reduce_scatter_tensor max")

    # broadcast from the last rank
    b = td.tensor(vals(me, 5).tolist())
    dist.broadcast(b, src=W - 1)
    close(b, vals(W - 1, 5), "broadcast")

    # send/recv around a ring, blocking for even ranks first, then isend/irecv
    nxt, prv = (me + 1) % W, (me - 1) % W
    got = td.zeros(4)
    if me % 2 == 0:
        dist.send(td.tensor(vals(me, 4).tolist()), nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(td.tensor(vals(me, 4).tolist()), nxt)
    close(got, vals(prv, 4), "send/recv ring")
    got2 = td.zeros(4)
    rq = dist.irecv(got2, prv, tag=7)
    sq = dist.isend(td.tensor(vals(me, 4, 1).tolist()), nxt, tag=7)
    sq.wait()
    rq.wait()
    close(got2, vals(prv, 4, 1), "isend/irecv ring")

    # all_to_all_single: equal splits (2 rows of 3 per peer) and uneven ones
    a = td.tensor((me * 100 + np.arange(2 * W * 3)).reshape(2 * W, 3).tolist(), dtype=td.float32)
    o = td.zeros(2 * W, 3)
    dist.all_to_all_single(o, a)
    want = np.concatenate([(r * 100 + np.arange(2 * W * 3)).reshape(2 * W, 3)[2 * me:2 * me + 2]
                           for r in range(W)])
    close(o, want, "all_to_all_single equal")
    # rank r sends (j + 1) rows to rank j, so rank me receives (me + 1) rows from each rank.
    in_splits = [j + 1 for j in range(W)]
    rows = sum(in_splits)
    a = td.tensor((me * 100 + np.arange(rows * 2)).reshape(rows, 2).tolist(), dtype=td.float32)
    o = td.zeros(W * (me + 1), 2)
    dist.all_to_all_single(o, a, output_split_sizes=[me + 1] * W, input_split_sizes=in_splits)
    start = sum(range(1, me + 1))
    want = np.concatenate([(r * 100 + np.arange(rows * 2)).reshape(rows, 2)[start:start + me + 1]
                           for r in range(W)])
    close(o, want, "all_to_all_single uneven")


def check_groups(W, me):
    g = dist.new_group([0, 1])
    if me in (0, 1):
        check(g is not None and g.size == 2 and g.rank == me, "new_group membership")
        t = td.ones(2) * (me + 1)
        dist.all_reduce(t, group=g)
        close(t, [3, 3], "all_reduce on new_group")
    else:
        check(g is None, "new_group non-member gets None")
    half = dist.split(me % 2, name="parity")
    check(half.size == (W + 1 - me % 2) // 2, "split size")
    t = td.tensor([float(me)])
    dist.all_reduce(t, group=half)
    close(t, [sum(r for r in range(W) if r % 2 == me % 2)], "all_reduce on split group")

    dims = dist.ParallelDims(tp=2, dp=W // 2)
    grid = dist.ProcessGrid(dist.world(), dims)
    check(grid.coords.tp == me % 2, "grid coords")
    for axes in ("tp", "dp", "pp", "dp-cp", "tp-pp", "ep", "edp"):
        comm = grid.group(axes)
        members = td.zeros(comm.size, dtype=td.int32)
        dist.all_gather_into_tensor(members, td.tensor([me], dtype=td.int32), group=comm)
        check(members.tolist() == dims.group_of(axes, me) == grid.group_ranks(axes),
              f"grid group {axes}: {members.tolist()} vs {dims.group_of(axes, me)}")
    check(grid.tp().name == "tp" and grid.dp().size == W // 2, "grid accessors")
    return grid


def check_autograd(W, me, grid):
    tp = grid.world()  # every rank: the whole world as the tensor-parallel group
    # gather_from_region: shared loss weights -> each rank's grad is its chunk of w.
    x = td.tensor(vals(me, 6).reshape(2, 3).tolist(), requires_grad=True)
    y = dist.nn.gather_from_region(x, tp)
    close(y, np.concatenate([vals(r, 6).reshape(2, 3) for r in range(W)], 1), "gather fwd")
    w = vals(0, 6 * W, 3).reshape(2, 3 * W)
    (y * td.tensor(w.tolist())).sum().backward()
    close(x.grad, w[:, 3 * me:3 * me + 3], "gather_from_region grad")
    # copy_to_region: rank-dependent weights -> grad is their sum.
    for dtype, tol in ((td.float32, 1e-6), (td.bfloat16, 1e-6)):
        x = td.tensor(vals(0, 4).tolist(), dtype=dtype, requires_grad=True)
        y = dist.nn.copy_to_region(x, tp)
        (y * td.tensor(vals(me, 4, 2).tolist(), dtype=dtype)).sum().backward()
        close(x.grad, sum(vals(r, 4, 2) for r in range(W)), f"copy_to_region grad {dtype}", tol)
    # reduce_scatter_to_sequence: fwd sum + own rows, bwd all_gather of rank-dependent weights.
    x = td.tensor(vals(me, 2 * W * 3).reshape(2 * W, 3).tolist(), requires_grad=True)
    y = dist.nn.reduce_scatter_to_sequence(x)  # default group: the world
    total = sum(vals(r, 2 * W * 3).reshape(2 * W, 3) for r in range(W))
    close(y, total[2 * me:2 * me + 2], "reduce_scatter_to_sequence fwd")
    (y * td.tensor(vals(me, 6, 4).reshape(2, 3).tolist())).sum().backward()
    close(x.grad, np.concatenate([vals(r, 6, 4).reshape(2, 3) for r in range(W)]),
          "reduce_scatter_to_sequence grad")
    # gather_from_sequence(tp_output_grad=False): shared weights -> own rows of w.
    x = td.tensor(vals(me, 3).reshape(1, 3).tolist(), requires_grad=True)
    y = dist.nn.gather_from_sequence(x, tp, tp_output_grad=False)
    w = vals(0, 3 * W, 5).reshape(W, 3)
    (y * td.tensor(w.tolist())).sum().backward()
    close(x.grad, w[me:me + 1], "gather_from_sequence(tp_output_grad=False) grad")


def check_errors(W, me):
    # A local error (wrong output size) raises TardelliError with the C++ text on every rank.
    try:
        dist.reduce_scatter_tensor(td.zeros(5), td.zeros(4 * W))
        check(False, "reduce_scatter_tensor with a bad output size did not raise")
    except td.TardelliError as e:
        check("reduce_scatter" in str(e), f"unexpected message: {e}")
    try:
        dist.nn.scatter_to_region(td.zeros(2 * W + 1), dist.world())
        check(False, "scatter_to_region of an indivisible size did not raise")
    except td.TardelliError as e:
        check(f"not divisible by the size {W} of group 'world'" in str(e), f"message: {e}")
    try:
        dist.ParallelDims(tp=3).validate(W)
        check(False, "validate did not raise")
    except td.TardelliError as e:
        check(f"tp*cp*pp*dp = 3 but world size is {W}" in str(e), f"message: {e}")
    # Mismatched sizes across ranks: the cross-rank check raises on every rank, naming them.
    try:
        dist.all_reduce(td.zeros(3 + me))
        check(False, "all_reduce with mismatched sizes did not raise")
    except td.TardelliError as e:
        check("all_reduce" in str(e) and "rank" in str(e), f"message: {e}")
    dist.barrier()  # still usable afterwards
    try:
        dist.init()
        check(False, "a second init did not raise")
    except td.TardelliError as e:
        check("already initialized" in str(e), f"message: {e}")


def main():
    dist.init(timeout_s=30)
    W, me = dist.world_size(), dist.rank()
    try:
        check_basics(W, me)
        check_collectives(W, me)
        grid = check_groups(W, me)
        check_autograd(W, me, grid)
        check_errors(W, me)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        dist._D.abort_world(1)
    flag = td.tensor([1], dtype=td.int32)
    dist.all_reduce(flag)
    if dist.is_main_process():
        print(f"ALL OK {W} ({flag.tolist()[0]} ranks)", flush=True)
    dist.destroy()


if __name__ == "__main__":
    main()
