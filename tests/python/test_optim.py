"""td.optim, td.optim.lr_scheduler, td.nn.utils.clip_grad_norm_ and td.amp.GradScaler against
torch.optim / torch's formulas.

Tolerances: optimizer runs feed the same float32 gradients to both libraries, so the only
differences are float32 rounding in a different operation order (AdamW's fused kernel computes
p - lr*wd*p - lr*m_hat/(sqrt(v_hat)+eps) in one expression where torch does p*(1-lr*wd) first
and divides by bias corrections separately). Each step contributes a few ulps of |p| (~1e-7
relative); over <= 8 steps we allow atol 2e-6 on parameters of magnitude ~1 (measured 4.8e-7).
SGD uses the same operations as torch in the same order (measured: bitwise equal); it is
compared at atol 1e-6 so a different but correct rounding (e.g. an FMA) would still pass.
Schedules are pure Python float64 and compared to 1e-12.
"""
import math

import numpy as np
import pytest
import torch

import tardelli as td


def as_np(t):
    return np.asarray(t.detach().float()) if isinstance(t, td.Tensor) else t.detach().numpy()


def make_params(shapes, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    tp = [torch.tensor(a, requires_grad=True) for a in arrays]
    dp = [td.nn.Parameter(td.tensor(a)) for a in arrays]
    return tp, dp


def feed_grads(tp, dp, rng, skip=()):
    """The same random gradient into each pair; indices in `skip` get no gradient."""
    for i, (a, b) in enumerate(zip(tp, dp)):
        if i in skip:
            a.grad, b.grad = None, None
            continue
        g = rng.standard_normal(tuple(a.shape)).astype(np.float32)
        a.grad = torch.tensor(g)
        b.grad = td.tensor(g)


def assert_params_close(tp, dp, atol=2e-6):
    for a, b in zip(tp, dp):
        np.testing.assert_allclose(as_np(b), as_np(a), rtol=0, atol=atol)


SHAPES = [(8, 5), (5,), (3, 4, 2), (7,)]


def groups(params, spec):
    """Param groups: spec is a list of (indices, overrides)."""
    return [dict(params=[params[i] for i in idx], **kw) for idx, kw in spec]


# ---- AdamW ----


@pytest.mark.parametrize("kwargs", [
    dict(lr=1e-2),
    dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
    dict(lr=1e-3, weight_decay=0.0),
])
def test_adamw_matches_torch(kwargs):
    # Property: AdamW (fused C++ kernel) follows torch.optim.AdamW step by step, including a
    # parameter that gets no gradient on some steps (its step count lags, its state is lazy).
    tp, dp = make_params(SHAPES)
    topt, dopt = torch.optim.AdamW(tp, **kwargs), td.optim.AdamW(dp, **kwargs)
    rng = np.random.default_rng(1)
    for step in range(8):
        feed_grads(tp, dp, rng, skip={3} if step < 3 else ())
        topt.step()
        dopt.step()
        assert_params_close(tp, dp)
    st_t, st_d = topt.state[tp[3]], dopt.state[dp[3]]
    assert st_d["step"].item() == st_t["step"].item() == 5
    np.testing.assert_allclose(as_np(st_d["exp_avg_sq"]), as_np(st_t["exp_avg_sq"]), rtol=1e-5)


def test_adamw_param_groups_and_lr_mutation():
    # Property: groups keep their own lr / weight decay (defaults fill the rest), and setting
    # g['lr'] between steps takes effect, as in torch.
    tp, dp = make_params(SHAPES)
    spec = [([0, 2], dict(lr=1e-2, weight_decay=0.1)), ([1, 3], dict(weight_decay=0.0))]
    topt = torch.optim.AdamW(groups(tp, spec), lr=3e-3)
    dopt = td.optim.AdamW(groups(dp, spec), lr=3e-3)
    assert dopt.param_groups[1]["lr"] == 3e-3 and dopt.param_groups[0]["lr"] == 1e-2
    assert dopt.param_groups[1]["betas"] == (0.9, 0.999)
    rng = np.random.default_rng(2)
    for step in range(6):
        if step == 3:
            for g in (*topt.param_groups, *dopt.param_groups):
                g["lr"] *= 0.5
        feed_grads(tp, dp, rng)
        topt.step()
        dopt.step()
    assert_params_close(tp, dp)


def test_adamw_closure_and_zero_grad():
    # Property: step(closure) evaluates the closure with grad enabled and returns its loss;
    # zero_grad() sets grads to None (default) or zeros them (set_to_none=False).
    p = td.nn.Parameter(td.tensor([1.0, -2.0]))
    opt = td.optim.AdamW([p], lr=0.1, weight_decay=0.0)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    with td.no_grad():
        loss = opt.step(closure)
    assert loss.item() == pytest.approx(5.0)
    # First Adam step moves each entry by lr against the sign of its gradient.
    np.testing.assert_allclose(p.detach().numpy(), [0.9, -1.9], rtol=1e-6)
    opt.zero_grad(set_to_none=False)
    assert p.grad is not None and np.all(p.grad.numpy() == 0)
    opt.zero_grad()
    assert p.grad is None


def test_optimizer_state_dict_format_and_round_trip():
    # Property: state_dict has torch's layout (params numbered across groups, 'step' /
    # 'exp_avg' / 'exp_avg_sq'); loading it into a fresh optimizer over copies of the
    # parameters continues bitwise identically; a torch AdamW state dict (converted to
    # tardelli tensors) loads and continues like torch.
    tp, dp = make_params(SHAPES)
    spec = [([0, 1], dict(lr=1e-2)), ([2, 3], dict(weight_decay=0.0))]
    topt = torch.optim.AdamW(groups(tp, spec), lr=3e-3)
    dopt = td.optim.AdamW(groups(dp, spec), lr=3e-3)
    rng = np.random.default_rng(3)
    for _ in range(3):
        feed_grads(tp, dp, rng)
        topt.step()
        dopt.step()
    sd, tsd = dopt.state_dict(), topt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]
    assert sorted(sd["state"]) == sorted(tsd["state"]) == [0, 1, 2, 3]
    assert set(sd["state"][0]) == set(tsd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert sd["state"][2]["step"].item() == tsd["state"][2]["step"].item() == 3

    # Resume from tardelli's own state dict.
    dp2 = [td.nn.Parameter(p.detach().clone()) for p in dp]
    dopt2 = td.optim.AdamW(groups(dp2, spec), lr=1.0)  # hyperparameters come from the dict
    dopt2.load_state_dict(sd)
    assert dopt2.param_groups[0]["lr"] == 1e-2 and dopt2.param_groups[1]["lr"] == 3e-3
    # Resume from torch's state dict.
    dp3 = [td.nn.Parameter(p.detach().clone()) for p in dp]
    dopt3 = td.optim.AdamW(groups(dp3, spec), lr=1.0)
    converted = {"param_groups": tsd["param_groups"],
                 "state": {k: {n: td.tensor(v.numpy()) for n, v in s.items()}
                           for k, s in tsd["state"].items()}}
    dopt3.load_state_dict(converted)
    for _ in range(3):
        g = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
        for ps in (dp, dp2, dp3):
            for p, gi in zip(ps, g):
                p.grad = td.tensor(gi)
        for p, gi in zip(tp, g):
            p.grad = torch.tensor(gi)
        for o in (dopt, dopt2, dopt3, topt):
            o.step()
    for a, b in zip(dp, dp2):
        assert np.array_equal(as_np(a), as_np(b))  # bitwise: same kernel, same state
    assert_params_close(tp, dp3)
    assert_params_close(tp, dp)


def test_optimizer_errors():
    # Property: misuse raises with a message, like torch.
    p, q = td.nn.Parameter(td.zeros(2)), td.nn.Parameter(td.zeros(3))
    with pytest.raises(ValueError, match="empty parameter list"):
        td.optim.AdamW([])
    with pytest.raises(ValueError, match="more than one parameter group"):
        td.optim.SGD([{"params": [p]}, {"params": [p, q]}], lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        td.optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="required optimization parameter lr"):
        td.optim.SGD([p])
    with pytest.raises(ValueError, match="Invalid learning rate"):
        td.optim.AdamW([p], lr=-1.0)
    with pytest.raises(TypeError, match="ordered collections"):
        td.optim.AdamW({p})
    opt = td.optim.AdamW([p, q])
    with pytest.raises(ValueError, match="different number of parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(ValueError, match="doesn't match the size"):
        opt.load_state_dict({"state": {}, "param_groups": [{"lr": 1.0, "params": [0]}]})


# ---- SGD ----


@pytest.mark.parametrize("kwargs", [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.05, momentum=0.8, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1),
    dict(lr=0.1, weight_decay=0.1, maximize=True),
])
def test_sgd_matches_torch(kwargs):
    # Property: SGD follows torch's algorithm (momentum buffer starts as the first gradient,
    # dampening, Nesterov look-ahead, L2 weight decay) over several steps with param groups.
    tp, dp = make_params(SHAPES)
    spec = [([0, 1], {}), ([2, 3], dict(lr=kwargs["lr"] * 3))]
    topt = torch.optim.SGD(groups(tp, spec), **kwargs)
    dopt = td.optim.SGD(groups(dp, spec), **kwargs)
    rng = np.random.default_rng(4)
    for step in range(6):
        feed_grads(tp, dp, rng, skip={1} if step == 2 else ())
        topt.step()
        dopt.step()
    assert_params_close(tp, dp, atol=1e-6)
    if kwargs.get("momentum"):
        np.testing.assert_allclose(as_np(dopt.state[dp[0]]["momentum_buffer"]),
                                   as_np(topt.state[tp[0]]["momentum_buffer"]), atol=1e-6)


def test_sgd_state_dict_round_trip():
    # Property: momentum buffers survive state_dict/load_state_dict; continuing is bitwise equal.
    _, dp = make_params(SHAPES)
    opt = td.optim.SGD(dp, lr=0.1, momentum=0.9, nesterov=True)
    rng = np.random.default_rng(5)
    for _ in range(2):
        for p in dp:
            p.grad = td.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32))
        opt.step()
    dp2 = [td.nn.Parameter(p.detach().clone()) for p in dp]
    opt2 = td.optim.SGD(dp2, lr=0.5, momentum=0.9, nesterov=True)
    opt2.load_state_dict(opt.state_dict())
    for _ in range(2):
        for p, q in zip(dp, dp2):
            g = rng.standard_normal(tuple(p.shape)).astype(np.float32)
            p.grad, q.grad = td.tensor(g), td.tensor(g)
        opt.step()
        opt2.step()
    for a, b in zip(dp, dp2):
        assert np.array_equal(as_np(a), as_np(b))


# ---- schedules ----


def ref_warmup_cosine(it, warmup, total, max_lr, min_lr):
    """Written out independently (Megatron's OptimizerParamScheduler.get_lr, init_lr = 0)."""
    if it <= warmup:
        return max_lr * it / warmup
    if it > total:
        return min_lr
    decay_ratio = (it - warmup) / (total - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (max_lr - min_lr)


def test_schedule_functions_follow_formulas():
    # Property: warmup_cosine_lr is Megatron's formula (0 at step 0, max_lr at step `warmup`),
    # the same numbers as the C++ td::optim::warmup_cosine; linear decay goes straight from max_lr
    # at the end of warmup to min_lr at `total`; constant stays at max_lr after warmup.
    S = td.optim.lr_scheduler
    for it in range(0, 130):
        assert S.warmup_cosine_lr(it, 10, 100, 6e-4, 6e-5) == pytest.approx(
            ref_warmup_cosine(it, 10, 100, 6e-4, 6e-5), rel=1e-12, abs=1e-18)
    assert S.warmup_cosine_lr(0, 10, 100, 1.0, 0.1) == 0.0  # Megatron: step 0 has lr 0
    assert S.warmup_cosine_lr(10, 10, 100, 1.0, 0.1) == 1.0  # warmup ends exactly at max_lr
    assert S.warmup_cosine_lr(55, 10, 100, 1.0, 0.0) == pytest.approx(0.5, rel=1e-12)
    assert S.linear_decay_lr(1, 4, 104, 1.0, 0.0) == 0.25
    assert S.linear_decay_lr(4, 4, 104, 1.0, 0.0) == 1.0
    assert S.linear_decay_lr(54, 4, 104, 2.0, 1.0) == pytest.approx(1.5, rel=1e-12)
    assert S.linear_decay_lr(104, 4, 104, 2.0, 1.0) == 1.0
    assert S.linear_decay_lr(500, 4, 104, 2.0, 1.0) == 1.0
    assert S.constant_lr(2, 4, 104, 2.0) == 1.0
    assert S.constant_lr(1000, 4, 104, 2.0) == 2.0
    assert S.warmup_cosine_lr(0, 0, 10, 1.0, 0.0) == 1.0  # no warmup: starts at max_lr


def _lr_trace(opt, sched, steps):
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    return np.array(out)


@pytest.mark.parametrize("which", ["lambda", "cosine", "linear"])
def test_schedulers_match_torch(which):
    # Property: LambdaLR / CosineAnnealingLR / LinearLR give torch's rate at every step, per
    # param group (torch's CosineAnnealingLR is recursive; ours is its closed form).
    tp, dp = make_params([(2,), (3,)])
    tg = [dict(params=[tp[0]], lr=0.1), dict(params=[tp[1]], lr=0.02)]
    dg = [dict(params=[dp[0]], lr=0.1), dict(params=[dp[1]], lr=0.02)]
    topt, dopt = torch.optim.SGD(tg, lr=0.1), td.optim.SGD(dg, lr=0.1)
    make = {
        "lambda": lambda m, o: m.LambdaLR(o, lambda s: 0.9**s),
        "cosine": lambda m, o: m.CosineAnnealingLR(o, T_max=10, eta_min=1e-3),
        "linear": lambda m, o: m.LinearLR(o, start_factor=0.25, total_iters=6),
    }[which]
    ts, ds = make(torch.optim.lr_scheduler, topt), make(td.optim.lr_scheduler, dopt)
    np.testing.assert_allclose(_lr_trace(dopt, ds, 15), _lr_trace(topt, ts, 15), rtol=1e-10)
    assert ds.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-10)


def test_warmup_cosine_scheduler_drives_groups():
    # Property: WarmupCosine sets each group's lr to warmup_cosine_lr(step, ...) with that
    # group's initial lr as max and min_lr_ratio * max as min; state_dict round trip resumes.
    _, dp = make_params([(2,), (3,)])
    opt = td.optim.AdamW([dict(params=[dp[0]], lr=1e-3), dict(params=[dp[1]], lr=1e-2)])
    sched = td.optim.lr_scheduler.WarmupCosine(opt, warmup_steps=5, total_steps=20,
                                               min_lr_ratio=0.1)
    f = td.optim.lr_scheduler.warmup_cosine_lr
    for step in range(25):
        for g, base in zip(opt.param_groups, (1e-3, 1e-2)):
            assert g["lr"] == pytest.approx(f(step, 5, 20, base, base * 0.1), rel=1e-12)
        if step == 10:
            saved = sched.state_dict()
        sched.step()
    sched2 = td.optim.lr_scheduler.WarmupDecay(opt, 5, 20, 0.1, style="linear")
    sched2.load_state_dict(saved)
    sched2.step()
    assert sched2.last_epoch == 11
    with pytest.raises(ValueError, match="style"):
        td.optim.lr_scheduler.WarmupDecay(opt, 5, 20, style="cubic")


# ---- clip_grad_norm_ ----


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    # Property: the returned total norm and the clipped gradients equal torch's (float32 sums
    # in another order: rtol 1e-5); with a large max_norm nothing changes.
    tp, dp = make_params(SHAPES)
    feed_grads(tp, dp, np.random.default_rng(6))
    tn = torch.nn.utils.clip_grad_norm_(tp, max_norm, norm_type)
    dn = td.nn.utils.clip_grad_norm_(dp, max_norm, norm_type)
    assert dn.dim() == 0 and dn.dtype == td.float32
    assert dn.item() == pytest.approx(tn.item(), rel=1e-5)
    for a, b in zip(tp, dp):
        np.testing.assert_allclose(as_np(b.grad), as_np(a.grad), rtol=1e-5, atol=1e-7)


def test_clip_grad_norm_edge_cases():
    # Property: parameters without grads are skipped; no grads gives a zero norm; a non-finite
    # norm raises only with error_if_nonfinite=True.
    p, q = td.nn.Parameter(td.ones(3)), td.nn.Parameter(td.ones(2))
    assert td.nn.utils.clip_grad_norm_([p, q], 1.0).item() == 0.0
    p.grad = td.tensor([3.0, 4.0, 0.0])
    total = td.nn.utils.clip_grad_norm_([p, q], 1.0)
    assert total.item() == pytest.approx(5.0)
    np.testing.assert_allclose(p.grad.numpy(), [0.6, 0.8, 0.0], rtol=1e-5)
    p.grad = td.tensor([math.inf, 1.0, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        td.nn.utils.clip_grad_norm_(p, 1.0, error_if_nonfinite=True)


# ---- GradScaler ----


def test_grad_scaler_skips_inf_step_and_backs_off():
    # Property: a step whose gradients contain inf or nan is skipped (parameters and optimizer
    # state untouched) and the scale is multiplied by backoff_factor; clean steps run with
    # gradients divided by the scale.
    p = td.nn.Parameter(td.tensor([1.0, 2.0]))
    opt = td.optim.SGD([p], lr=0.5)
    scaler = td.amp.GradScaler(init_scale=8.0, growth_interval=3)
    loss = (p * p).sum()
    scaled = scaler.scale(loss)
    assert scaled.item() == pytest.approx(8.0 * loss.item())
    scaled.backward()
    np.testing.assert_allclose(p.grad.numpy(), [16.0, 32.0])  # 8 * 2p
    scaler.step(opt)
    scaler.update()
    np.testing.assert_allclose(p.detach().numpy(), [0.0, 0.0])  # 1 - 0.5*2, 2 - 0.5*4
    assert scaler.get_scale() == 8.0
    for bad in (math.inf, math.nan):
        p.grad = td.tensor([1.0, bad])
        before = p.detach().clone()
        assert scaler.step(opt) is None
        scaler.update()
        assert np.array_equal(p.detach().numpy(), before.numpy())
    assert scaler.get_scale() == 2.0  # halved twice
    assert scaler.state_dict()["_growth_tracker"] == 0


def test_grad_scaler_grows_after_growth_interval():
    # Property: after growth_interval consecutive clean steps the scale is multiplied by
    # growth_factor and the counter restarts; an overflow resets the counter.
    p = td.nn.Parameter(td.tensor([1.0]))
    opt = td.optim.SGD([p], lr=0.0)
    scaler = td.amp.GradScaler(init_scale=4.0, growth_factor=2.0, backoff_factor=0.25,
                               growth_interval=3)
    history = []
    for grad in [1, 1, 1, 1, math.inf, 1, 1, 1]:
        p.grad = td.tensor([float(grad)])
        scaler.step(opt)
        scaler.update()
        history.append(scaler.get_scale())
    assert history == [4.0, 4.0, 8.0, 8.0, 2.0, 2.0, 2.0, 4.0]


def test_grad_scaler_unscale_then_clip_and_errors():
    # Property: unscale_ before clipping makes clip_grad_norm_ see true gradients; calling it
    # twice, or update() without any inf check, raises like torch; a disabled scaler is a no-op.
    p = td.nn.Parameter(td.tensor([3.0, 4.0]))
    opt = td.optim.SGD([p], lr=1.0)
    scaler = td.amp.GradScaler(init_scale=1024.0)
    p.grad = td.tensor([3.0 * 1024, 4.0 * 1024])
    scaler.unscale_(opt)
    assert td.nn.utils.clip_grad_norm_([p], 1.0).item() == pytest.approx(5.0)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)  # does not unscale again
    np.testing.assert_allclose(p.detach().numpy(), [3 - 0.6, 4 - 0.8], rtol=1e-5)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    scaler.update()
    with pytest.raises(RuntimeError, match="No inf checks"):
        scaler.update()
    off = td.amp.GradScaler(enabled=False)
    x = td.tensor(2.0)
    assert off.scale(x) is x and off.get_scale() == 1.0


def test_grad_scaler_fp16_forward_with_fp32_master_weights():
    # Property: the intended fp16 recipe works end to end: fp32 master weights, an fp16
    # forward whose loss gradient would underflow in fp16 without scaling, fp32 gradients
    # accumulated through the cast; the scaled-and-unscaled gradient equals the fp32 one
    # to fp16 rounding (relative 1e-3: fp16 has 11 significant bits; gradients are ~1e-6, so
    # an absolute 1e-10 covers the rounding of the smallest ones).
    w = td.nn.Parameter(td.tensor(np.full(64, 1e-3, dtype=np.float32)))
    x = td.tensor(np.linspace(-1, 1, 64, dtype=np.float32))
    opt = td.optim.SGD([w], lr=1.0)

    def loss_fn():
        return ((w.half() * x.half()).sum() * 1e-6).float()

    loss_fn().backward()
    unscaled = w.grad.clone()
    w.grad = None
    # Without scaling the per-element gradient 1e-6 * x is subnormal in fp16 (spacing 6e-8):
    # entries near x = 0 flush to zero and the rest lose most of their digits.
    assert (unscaled.numpy() == 0).sum() > 0
    assert np.abs(unscaled.numpy() - 1e-6 * x.numpy()).max() > 1e-8
    scaler = td.amp.GradScaler(init_scale=2.0**10)
    scaler.scale(loss_fn()).backward()
    assert w.grad.dtype == td.float32
    scaler.unscale_(opt)
    np.testing.assert_allclose(w.grad.numpy(), 1e-6 * x.numpy(), rtol=1e-3, atol=1e-10)
    scaler.step(opt)
    scaler.update()


def _adamw_run(capturable, steps=6):
    rng = np.random.default_rng(3)
    ws = [td.tensor(rng.standard_normal((7, 5)).astype(np.float32)),
          td.tensor(rng.standard_normal(5).astype(np.float32))]
    for w in ws:
        w.requires_grad_(True)
    opt = td.optim.AdamW(ws, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1,
                         capturable=capturable)
    for i in range(steps):
        loss = ((ws[0] * ws[0]).sum() + (ws[1] * 3).sum()) * (i + 1)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i == 2:
            opt.param_groups[0]["lr"] = 1e-3  # a schedule's change reaches the lr tensor
    return [as_np(w.detach()) for w in ws], opt


def test_adamw_capturable_matches_and_saves():
    """capturable=True (Note [Capturable AdamW]) keeps the step count and the learning rate in
    tensors the kernel reads; its coefficients are formed in float32 instead of double, so the
    parameters agree with the default path to 1e-6 relative over six steps (a changed lr
    included); the step is a tensor that counts the steps, and state_dict() holds no device
    tensors in its groups (the lr tensors live beside them)."""
    a, _ = _adamw_run(False)
    b, opt = _adamw_run(True)
    for x, y in zip(a, b):
        assert np.abs(x - y).max() <= 1e-6 * np.abs(x).max()
    p0 = opt.param_groups[0]["params"][0]
    assert float(opt.state[p0]["step"].item()) == 6.0
    sd = opt.state_dict()
    assert all(not isinstance(v, td.Tensor) for g in sd["param_groups"] for k, v in g.items()
               if k != "params")
    assert sd["param_groups"][0]["capturable"] is True
