"""Learning-rate schedules: torch-style scheduler classes and the plain formulas they use.

Note [Schedule step convention]: `step` counts optimizer steps from 0, and the formulas are
the C++ library's (include/tardelli/optim/lr_schedule.h), which are Megatron-LM's
OptimizerParamScheduler with init_lr = 0: warmup raises the rate linearly as
max_lr * step / warmup (0 at step 0) and reaches max_lr at step `warmup`; then the rate decays
to min_lr at step `total` (decay_ratio = (step - warmup) / (total - warmup)) and stays there.
The Python training CLI and the C++ trainer therefore follow the same learning-rate sequence.
"""
import math

from .optimizer import Optimizer


def _warmup_decay(step, warmup, total, max_lr, min_lr, coeff_fn):
    if warmup > 0 and step <= warmup:
        return max_lr * step / warmup
    if step >= total:
        return min_lr
    ratio = (step - warmup) / (total - warmup)
    return min_lr + coeff_fn(ratio) * (max_lr - min_lr)


def warmup_cosine_lr(step, warmup, total, max_lr, min_lr=0.0):
    """Linear warmup, then half a cosine from max_lr down to min_lr at `total` (Megatron)."""
    return _warmup_decay(step, warmup, total, max_lr, min_lr,
                         lambda r: 0.5 * (1.0 + math.cos(math.pi * r)))


def linear_decay_lr(step, warmup, total, max_lr, min_lr=0.0):
    """Linear warmup, then a straight line from max_lr down to min_lr at `total` (Megatron)."""
    return _warmup_decay(step, warmup, total, max_lr, min_lr, lambda r: 1.0 - r)


def constant_lr(step, warmup, total, max_lr, min_lr=0.0):
    """Linear warmup, then max_lr for ever (`total` and `min_lr` are ignored)."""
    if warmup > 0 and step <= warmup:
        return max_lr * step / warmup
    return max_lr


class LRScheduler:
    """Base class with torch's protocol: construction sets the rate for step 0
    (last_epoch = 0); each step() after optimizer.step() moves to the next step."""

    def __init__(self, optimizer, last_epoch=-1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for g in optimizer.param_groups:
                g.setdefault("initial_lr", g["lr"])
        else:
            for i, g in enumerate(optimizer.param_groups):
                if "initial_lr" not in g:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] "
                                   "when resuming an optimizer")
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._last_lr = None
        self.step()

    def get_lr(self):
        raise NotImplementedError

    def get_last_lr(self):
        return self._last_lr

    def step(self, epoch=None):
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        lrs = self.get_lr()
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


_LRScheduler = LRScheduler


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(step); one function, or one per param group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"Expected {n} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [b * f(self.last_epoch) for b, f in zip(self.base_lrs, self.lr_lambdas)]

    def state_dict(self):
        d = super().state_dict()
        d["lr_lambdas"] = [None] * len(self.lr_lambdas)  # functions are not state
        return d

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        state_dict.pop("lr_lambdas", None)
        super().load_state_dict(state_dict)


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base_lr - eta_min) * (1 + cos(pi * step / T_max)) / 2 (torch's closed form;
    torch computes the same curve recursively)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        c = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
        return [self.eta_min + (b - self.eta_min) * c for b in self.base_lrs]


class LinearLR(LRScheduler):
    """Multiplies base_lr by a factor moving linearly from start_factor to end_factor over
    total_iters steps (torch's closed form)."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
            raise ValueError("LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1]")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t = min(self.total_iters, self.last_epoch)
        f = self.start_factor + (self.end_factor - self.start_factor) * t / self.total_iters
        return [b * f for b in self.base_lrs]


class WarmupDecay(LRScheduler):
    """Warmup then cosine / linear / constant decay (Note [Schedule step convention]); each
    group's max_lr is its initial lr and its min_lr is max_lr * min_lr_ratio."""

    _styles = {"cosine": warmup_cosine_lr, "linear": linear_decay_lr, "constant": constant_lr}

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr_ratio=0.0, style="cosine",
                 last_epoch=-1):
        if style not in self._styles:
            raise ValueError(f"WarmupDecay: style must be one of {sorted(self._styles)}, "
                             f"got {style!r}")
        if warmup_steps < 0 or total_steps < warmup_steps:
            raise ValueError(f"WarmupDecay: need 0 <= warmup_steps <= total_steps, got "
                             f"{warmup_steps} and {total_steps}")
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.min_lr_ratio, self.style = min_lr_ratio, style
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        f = self._styles[self.style]
        return [f(self.last_epoch, self.warmup_steps, self.total_steps, b, b * self.min_lr_ratio)
                for b in self.base_lrs]


class WarmupCosine(WarmupDecay):
    def __init__(self, optimizer, warmup_steps, total_steps, min_lr_ratio=0.0, last_epoch=-1):
        super().__init__(optimizer, warmup_steps, total_steps, min_lr_ratio, "cosine",
                         last_epoch)


__all__ = ["warmup_cosine_lr", "linear_decay_lr", "constant_lr", "LRScheduler", "LambdaLR",
           "CosineAnnealingLR", "LinearLR", "WarmupDecay", "WarmupCosine"]
