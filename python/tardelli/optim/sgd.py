"""tardelli.optim.SGD: torch.optim.SGD (momentum, dampening, Nesterov, weight decay)."""
from .. import _C
from .._tensor import TardelliNotImplementedError
from .optimizer import Optimizer, required


class SGD(Optimizer):
    """torch's algorithm, per parameter with gradient g:

        d = g + wd * p
        buf = d (first step) | momentum * buf + (1 - dampening) * d
        d = d + momentum * buf (nesterov) | buf
        p = p - lr * d

    State: 'momentum_buffer' (None while momentum is 0).
    """

    def __init__(self, params, lr=required, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        if differentiable:
            raise TardelliNotImplementedError("SGD: differentiable=True is not supported")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=foreach, differentiable=False)
        super().__init__(params, defaults)

    def _update_group(self, group):
        lr, momentum = float(group["lr"]), float(group["momentum"])
        dampening, wd = float(group["dampening"]), float(group["weight_decay"])
        for p in group["params"]:
            if p.grad is None:
                continue
            d = p.grad
            if group["maximize"]:
                d = _C.neg(d)
            if wd != 0:
                d = _C.add(d, p, alpha=wd)
            st = self.state[p]
            if momentum != 0:
                buf = st.get("momentum_buffer")
                if buf is None:
                    buf = d.detach().clone()
                    st["momentum_buffer"] = buf
                else:
                    buf.mul_(momentum).add_(d, alpha=1.0 - dampening)
                d = _C.add(d, buf, alpha=momentum) if group["nesterov"] else buf
            else:
                st["momentum_buffer"] = None
            p.add_(d, alpha=-lr)
