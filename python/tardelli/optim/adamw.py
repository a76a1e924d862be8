"""tardelli.optim.AdamW: torch.optim.AdamW over the fused multi-tensor C++ kernel."""

from .. import _C
from .. import ops
from .._tensor import TardelliNotImplementedError
from .optimizer import Optimizer, _scalar_step, _step_tensor

_f32 = _C.dtype.float32


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter), torch's algorithm:

        m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
        p = p - lr*wd*p - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)

    State per parameter: 'step' (float32 0-d tensor), 'exp_avg', 'exp_avg_sq'.
    Note [fp32 optimizer state]: the moments are always float32 whatever the parameter dtype
    (the fused kernel computes in fp32 and rounds the parameter once).

    capturable=True (as torch's): 'step' lives on the parameters' device and the learning rate
    in a device tensor, both read by the kernel, so step() can be captured in a CUDA graph and
    replayed (Note [Capturable AdamW]; td.cuda.graph). Each group's parameters must be on one
    device and share one step count. A replay uses the learning-rate tensor's value: after changing group["lr"] outside a
    captured step (a scheduler), call sync_lr() before the next replay. The first step() of a
    set of tensors waits for the device once: run it eagerly before capturing.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if amsgrad or maximize or differentiable:
            raise TardelliNotImplementedError(
                "AdamW: amsgrad, maximize and differentiable are not supported")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=False, maximize=False, foreach=foreach,
                        capturable=bool(capturable), differentiable=False, fused=fused)
        super().__init__(params, defaults)

    def _lr_slot(self, group, device):
        """[device lr tensor, the group["lr"] it holds] of a capturable group (kept beside the
        param groups, which state_dict() saves)."""
        slots = self.__dict__.setdefault("_lr_slots", {})
        if id(group) not in slots:
            slots[id(group)] = [_C.zeros([], _f32, device, False), None]
        return slots[id(group)]

    def sync_lr(self):
        """Copies each capturable group's group["lr"] into its device learning-rate tensor (what
        a captured step reads); step() does it too, outside a capture."""
        for group in self.param_groups:
            slot = self.__dict__.get("_lr_slots", {}).get(id(group))
            if slot is not None and slot[1] != group["lr"]:
                slot[0].fill_(float(group["lr"]))
                slot[1] = group["lr"]

    def _state_of(self, p, step_on_device):
        """The state of parameter p (which must be contiguous), created at its first step with
        the step count on p's device (capturable) or on the host."""
        if not p.is_contiguous():
            raise ValueError(f"AdamW: parameter of shape {list(p.shape)} is not contiguous; "
                             "the fused update needs contiguous parameters")
        st = self.state[p]
        if not st:
            st["step"] = _C.zeros([], _f32, p.device, False) if step_on_device \
                else _step_tensor(0)
            st["exp_avg"] = _C.zeros(list(p.shape), _f32, p.device, False)
            st["exp_avg_sq"] = _C.zeros(list(p.shape), _f32, p.device, False)
        return st

    def _update_group_capturable(self, group):
        beta1, beta2 = group["betas"]
        ps, gs, ms, vs = [], [], [], []
        step = None  # the group's step tensor (see below)
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self._state_of(p, step_on_device=True)
            if str(st["step"].device) != str(p.device):  # loaded state: steps to the device
                st["step"] = st["step"]._to_device(p.device).to(_f32)
            # The group's parameters take their steps together (the fused kernel reads one
            # step count): they share the first one's step tensor, which the kernel advances.
            if step is None:
                step = st["step"]
            elif st["step"] is not step:
                st["step"] = step
            ps.append(p)
            gs.append(p.grad.contiguous())
            ms.append(st["exp_avg"])
            vs.append(st["exp_avg_sq"])
        if not ps:
            return
        lr = self._lr_slot(group, ps[0].device)[0]
        self.sync_lr()
        ops.adamw_step_capturable(ps, gs, ms, vs, lr=lr, step=step,
                                  beta1=float(beta1), beta2=float(beta2),
                                  eps=float(group["eps"]),
                                  weight_decay=float(group["weight_decay"]))

    def _cast_state(self, param, key, value):
        if key in ("exp_avg", "exp_avg_sq"):
            return value._to_device(param.device).to(_f32).contiguous().clone()
        return super()._cast_state(param, key, value)

    def _update_group(self, group):
        if group.get("capturable"):
            return self._update_group_capturable(group)
        beta1, beta2 = group["betas"]
        # Parameters are batched by step count (they differ only when some parameter had no
        # gradient on some step), one multi-tensor kernel call per batch.
        batches = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self._state_of(p, step_on_device=False)
            step = _scalar_step(st["step"]) + 1
            st["step"] = _step_tensor(step)
            b = batches.setdefault(step, ([], [], [], []))
            b[0].append(p)
            b[1].append(p.grad.contiguous())
            b[2].append(st["exp_avg"])
            b[3].append(st["exp_avg_sq"])
        for step, (ps, gs, ms, vs) in batches.items():
            ops.adamw_step(ps, gs, ms, vs, lr=float(group["lr"]), beta1=float(beta1),
                           beta2=float(beta2), eps=float(group["eps"]),
                           weight_decay=float(group["weight_decay"]), step=step)


