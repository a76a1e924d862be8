"""tardelli.optim.Optimizer: param groups, per-parameter state and torch's state_dict format."""
import collections

from .. import _C
from .._tensor import Tensor
from ..autograd import enable_grad, no_grad


class _Required:
    def __repr__(self):
        return "<required parameter>"


required = _Required()


class Optimizer:
    """Base class (torch.optim.Optimizer's contract).

    `param_groups` is a list of dicts, each with 'params' (a list of tensors) and every
    hyperparameter (missing ones filled from `defaults`); users may change them between steps
    (g['lr'] = x). `state` maps a parameter to its dict of state (created lazily on the first
    step that sees a gradient for it).
    """

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self.state = collections.defaultdict(dict)
        self.param_groups = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Tensors or dicts, but got {type(params).__name__}")
        if isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, param_group):
        if not isinstance(param_group, dict):
            raise TypeError(f"param group must be a dict, but got {type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        params = list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params "
                                f"is {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        group["params"] = params
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            group.setdefault(name, default)
        ids = [p._impl_id() for p in params]
        if len(set(ids)) != len(ids):
            raise ValueError("optimizer contains a parameter group with duplicate parameters")
        existing = {p._impl_id() for g in self.param_groups for p in g["params"]}
        if existing.intersection(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    with no_grad():
                        p.grad.zero_()

    def step(self, closure=None):
        """Evaluates `closure` (with grad enabled) if given, then updates every parameter that
        has a gradient; returns the closure's loss."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                self._update_group(group)
        return loss

    def _update_group(self, group):
        raise NotImplementedError

    # ---- state dict (torch's format) ----

    def state_dict(self):
        """{'state': {index: {...}}, 'param_groups': [{..., 'params': [indices]}]} with
        parameters numbered in group order, as torch does. Values are the live state tensors."""
        index = {}
        groups = []
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            ids = []
            for p in g["params"]:
                index.setdefault(p._impl_id(), len(index))
                ids.append(index[p._impl_id()])
            packed["params"] = ids
            groups.append(packed)
        state = {}
        for p, s in self.state.items():
            state[index[p._impl_id()]] = s
        return {"state": state, "param_groups": groups}

    def _cast_state(self, param, key, value):
        """A copy of a loaded state value placed for `param` (subclasses choose the dtype)."""
        if isinstance(value, Tensor):
            if key != "step" and value.is_floating_point():
                value = value.to(param.dtype)
            return value._to_device(param.device).clone()
        return value

    def load_state_dict(self, state_dict):
        """Restores state and hyperparameters saved by state_dict() (from this class or from
        a torch optimizer converted to tardelli tensors); the values are copied."""
        groups = self.param_groups
        saved_groups = state_dict["param_groups"]
        if len(groups) != len(saved_groups):
            raise ValueError(f"loaded state dict has a different number of parameter groups "
                             f"({len(saved_groups)} vs {len(groups)})")
        for g, sg in zip(groups, saved_groups):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't "
                                 f"match the size of optimizer's group ({len(sg['params'])} "
                                 f"vs {len(g['params'])})")
        id_map = {}
        for g, sg in zip(groups, saved_groups):
            for p, i in zip(g["params"], sg["params"]):
                id_map[i] = p
        state = collections.defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k not in id_map:
                state[k] = v
                continue
            p = id_map[k]
            state[p] = {key: self._cast_state(p, key, value) for key, value in v.items()}
        new_groups = []
        for g, sg in zip(groups, saved_groups):
            ng = {k: v for k, v in sg.items() if k != "params"}
            ng["params"] = g["params"]
            new_groups.append(ng)
        self.state = state
        self.param_groups = new_groups

    def __repr__(self):
        s = type(self).__name__ + " ("
        for i, g in enumerate(self.param_groups):
            s += f"\nParameter Group {i}"
            for k in sorted(g):
                if k != "params":
                    s += f"\n    {k}: {g[k]}"
        return s + "\n)"


def _scalar_step(value):
    """state['step'] as a Python int (stored as a float32 0-d tensor, as torch does)."""
    return int(value.item()) if isinstance(value, Tensor) else int(value)


def _step_tensor(n):
    return _C.scalar_tensor(float(n), _C.dtype.float32)


