"""tardelli.amp: dynamic loss scaling for float16 training (torch.cuda.amp.GradScaler).

Typical use, with fp32 master parameters whose forward runs in float16:

    scaler = td.amp.GradScaler()
    loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)                 # optional: before clipping
    td.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)                     # skipped when a gradient is inf/nan
    scaler.update()                      # backoff on overflow, growth after growth_interval

bf16 needs none of this (its exponent range is fp32's).
"""
import enum
import math

import numpy as np

from . import _C
from ._tensor import Tensor
from .autograd import no_grad


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _all_finite(t):
    # Note [Finite check]: 0 * x is 0 for every finite x and nan for inf and nan, so the sum
    # of t * 0 is exactly 0 iff every element is finite (no overflow possible, unlike sum(t)).
    return _C.mul(t.detach(), 0.0).float().sum().item() == 0.0


class GradScaler:
    """Scales the loss by `scale` so small float16 gradients do not flush to zero, unscales
    the gradients before the optimizer step, skips steps whose gradients overflowed, and adapts
    the scale as torch does: x backoff_factor after an overflow, x growth_factor after
    growth_interval consecutive clean steps (the scale is kept in float32, like torch's)."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if growth_factor <= 1.0:
            raise ValueError("The growth factor must be > 1.0.")
        if backoff_factor >= 1.0:
            raise ValueError("The backoff factor must be < 1.0.")
        self._enabled = enabled
        self._scale = float(np.float32(init_scale))
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._per_optimizer = {}

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self):
        return self._growth_factor

    def get_backoff_factor(self):
        return self._backoff_factor

    def get_growth_interval(self):
        return self._growth_interval

    def _opt_state(self, optimizer):
        return self._per_optimizer.setdefault(id(optimizer),
                                              {"stage": _Stage.READY, "found_inf": False})

    def scale(self, outputs):
        """outputs * scale (a tensor, or a list/tuple of tensors); the dtype is kept."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    def unscale_(self, optimizer):
        """Divides the optimizer's gradients by the scale, in place, and records whether any
        was inf/nan. At most once per optimizer between update() calls."""
        if not self._enabled:
            return
        st = self._opt_state(optimizer)
        if st["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update().")
        if st["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = float(np.float32(1.0) / np.float32(self._scale))
        found_inf = False
        with no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    if g.dtype == _C.dtype.float16:
                        raise ValueError("Attempting to unscale FP16 gradients: keep fp32 master "
                                         "parameters (their gradients accumulate in fp32).")
                    if not _all_finite(g):
                        found_inf = True
                    g.mul_(inv_scale)
        st["found_inf"] = found_inf
        st["stage"] = _Stage.UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step(*args, **kwargs) unless a gradient is inf/nan (then skipped and
        None is returned). Unscales first if unscale_() was not called."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        st = self._opt_state(optimizer)
        if st["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if st["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        ret = None
        if not st["found_inf"]:
            ret = optimizer.step(*args, **kwargs)
        st["stage"] = _Stage.STEPPED
        return ret

    def update(self, new_scale=None):
        """Adapts the scale from the inf checks since the last update (or sets new_scale)."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(np.float32(float(new_scale)))
        else:
            checks = [s["found_inf"] for s in self._per_optimizer.values()
                      if s["stage"] is not _Stage.READY]
            if not checks:
                raise RuntimeError("No inf checks were recorded prior to update().")
            f32 = np.float32
            if any(checks):
                self._scale = float(f32(self._scale) * f32(self._backoff_factor))
                self._growth_tracker = 0
            else:
                successful = self._growth_tracker + 1
                if successful == self._growth_interval:
                    grown = f32(self._scale) * f32(self._growth_factor)
                    if math.isfinite(grown):
                        self._scale = float(grown)
                    self._growth_tracker = 0
                else:
                    self._growth_tracker = successful
        self._per_optimizer = {}

    def state_dict(self):
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])


__all__ = ["GradScaler"]
