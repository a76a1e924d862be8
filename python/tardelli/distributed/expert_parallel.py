"""Expert parallelism for the GPT's mixture-of-experts layers (include/tardelli/parallel/
expert_parallel.h), and the two gradient groups it needs.

    grid = dist.ProcessGrid(world, dist.ParallelDims(dp=4, ep=2), extra_axes=["tp-ep-pp"])
    model = td.models.GPT(cfg)                 # every expert, from cfg.seed, on every rank
    dist.expert_parallel(model, grid.ep())     # keep this rank's E / ep experts
    ddp = dist.ExpertDataParallel(model.named_parameters(), grid, zero=1)
    opt = dist.ExpertDistributedOptimizer(ddp, model.param_groups(0.1), lr=3e-4)

Note [Expert gradients]: the ep ranks are data-parallel ranks of the dense layers (ep is carved
out of dp: Note [Expert layout] in process_grid.h). A dense parameter's gradient is the mean over
the dp group of every rank's gradient. An expert lives on the edp = dp / ep ranks of its expert-
data-parallel group only, and its local gradient already sums the contributions of the tokens
that every rank of its ep group routed to it (the all-to-all's backward brings them back). So
the mean over all dp ranks' losses is the sum over edp, divided by dp = edp x ep: the experts'
DDP averages over edp with grad_scale 1 / ep. The two DDPs' reductions run on different
communicators; the experts' is launched after backward (overlap off), so every rank issues the
collectives of both groups in the same order.

The global gradient norm adds the dense part (summed over the model-parallel group as without
experts) and the experts' part summed over the tp-ep-pp group, counted on tp rank 0 only
(experts are not split over tp: Note [MoE under tensor parallelism] in src/models/gpt.cpp).
"""
import contextlib
import math

from .. import _C
from .data_parallel import DistributedDataParallel, DistributedOptimizer


def is_expert_parameter(name):
    """Whether parameter `name` of a GPT is a routed expert's (split over ep)."""
    return ".mlp.experts." in name


def expert_parallel(model, ep):
    """Keeps this rank's num_experts / ep.size experts of every MoE layer of `model` (a
    td.models.GPT or pipeline stage, before ZeRO-3 sharding) and routes tokens to the experts
    of the other ranks with all-to-alls over `ep` (a communicator). Returns the model."""
    if ep is None or ep.size == 1:
        return model
    _C.parallel.apply_expert_parallel(model._cpp, ep)
    model._mirror_parameters()
    return model


def split_named(named):
    """(dense, experts): the (name, parameter) pairs of `named`, in order."""
    dense = [(n, p) for n, p in named if not is_expert_parameter(n)]
    experts = [(n, p) for n, p in named if is_expert_parameter(n)]
    return dense, experts


class ExpertDataParallel:
    """Two DistributedDataParallel: the dense parameters over `dense_group` (the grid's dp
    group, or dp-cp) and the experts over `edp_group` with grad_scale 1 / ep (Note [Expert
    gradients]). The interface of one DDP for the training loop."""

    def __init__(self, named, dense_group, edp_group, ep_size, bucket_mb=40, zero=0,
                 own_bucket=(), compressor=None):
        dense, experts = split_named(list(named))
        if not experts:
            raise _C.TardelliError("ExpertDataParallel: the model has no expert parameters "
                                   "(num_experts = 0?)")
        self.zero = int(zero)
        self.named_dense, self.named_experts = dense, experts
        # compressor: None, or a function returning a fresh GradCompressor (one per DDP).
        self.dense = DistributedDataParallel(dense, group=dense_group, bucket_mb=bucket_mb,
                                             zero=zero, own_bucket=own_bucket,
                                             compressor=compressor() if compressor else None)
        self.experts = DistributedDataParallel(experts, group=edp_group, bucket_mb=bucket_mb,
                                               zero=zero, overlap=False,
                                               grad_scale=1.0 / ep_size,
                                               compressor=compressor() if compressor else None)
        self.ep_size = ep_size

    @contextlib.contextmanager
    def no_sync(self, enabled=True):
        with self.dense.no_sync(enabled), self.experts.no_sync(enabled):
            yield

    def finish_grad_sync(self):
        self.dense.finish_grad_sync()
        self.experts.finish_grad_sync()

    def zero_grad(self, set_to_none=False):
        self.dense.zero_grad(set_to_none)
        self.experts.zero_grad(set_to_none)


class ExpertDistributedOptimizer:
    """ZeRO-1/2 AdamW over an ExpertDataParallel: one DistributedOptimizer per group (the
    dense shards over dp, the expert shards over edp), one global gradient norm. param_groups
    are torch-style dicts over both kinds of parameters; `self.param_groups` lists the two
    optimizers' groups (set "lr" on each)."""

    def __init__(self, ddp, param_groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, offload=False):
        groups = [dict(g) for g in param_groups]
        self._opts = []
        for ddp_part, named in ((ddp.dense, ddp.named_dense), (ddp.experts, ddp.named_experts)):
            members = {p._impl_id() for _, p in named}
            part_groups = [dict(g, params=[p for p in g["params"] if p._impl_id() in members])
                           for g in groups]
            part_groups = [g for g in part_groups if g["params"]]
            self._opts.append(DistributedOptimizer(ddp_part, part_groups, lr=lr, betas=betas,
                                                   eps=eps, weight_decay=weight_decay,
                                                   offload=offload))
        self.dense, self.experts = self._opts
        self.offload = bool(offload)

    @property
    def param_groups(self):
        return self.dense.param_groups + self.experts.param_groups

    def set_model_parallel(self, model, group):
        """The dense optimizer's norm over the model-parallel `group` (tp or tp-pp)."""
        self.dense.set_model_parallel(model, group)

    def set_expert_parallel(self, model, expert_group):
        """The experts' norm summed over `expert_group` (the grid's tp-ep-pp group)."""
        self.experts.set_model_parallel(model, expert_group)

    def step(self):
        self.dense.step()
        self.experts.step()

    def zero_grad(self, set_to_none=False):
        self.dense.zero_grad(set_to_none)
        self.experts.zero_grad(set_to_none)

    def grad_norm(self):
        return math.sqrt(self.dense.grad_norm() ** 2 + self.experts.grad_norm() ** 2)

    def clip_grad_norm(self, max_norm):
        """torch.nn.utils.clip_grad_norm_ over both groups; returns the norm before clipping."""
        norm = self.grad_norm()
        if math.isfinite(norm) and math.isfinite(max_norm):
            coef = max_norm / (norm + 1e-6)
            if coef < 1.0:
                self.scale_grads_(coef)
        return norm

    def scale_grads_(self, factor):
        self.dense.scale_grads_(factor)
        self.experts.scale_grads_(factor)

    def optimizer_state_bytes(self):
        return self.dense.optimizer_state_bytes() + self.experts.optimizer_state_bytes()

    def host_state_bytes(self):
        return self.dense.host_state_bytes() + self.experts.host_state_bytes()

    def state_dict(self):
        """This rank's shards of both optimizers; the parameter names are disjoint and "step"
        is the same in both."""
        out = self.dense.state_dict()
        for k, v in self.experts.state_dict().items():
            if k in out and k != "step":
                raise _C.TardelliError(f"ExpertDistributedOptimizer: state key {k!r} in both "
                                       "groups")
            out.setdefault(k, v)
        return out

    def load_state_dict(self, state):
        names = [set(self.dense.state_dict()), set(self.experts.state_dict())]
        for opt, keys in zip(self._opts, names):
            opt.load_state_dict({k: v for k, v in state.items() if k in keys})


__all__ = ["ExpertDataParallel", "ExpertDistributedOptimizer", "expert_parallel",
           "is_expert_parameter", "split_named"]
