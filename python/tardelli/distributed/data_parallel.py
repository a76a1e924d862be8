"""Data parallelism: bucketed, overlapped gradient averaging (DDP) and the ZeRO-1 optimizer.

    import tardelli as td
    import tardelli.distributed as dist

    dist.init()
    model = td.models.GPT(cfg)
    ddp = dist.DistributedDataParallel(model, bucket_mb=40, zero=True)
    opt = dist.DistributedOptimizer(ddp, model.param_groups(0.1), lr=3e-4, betas=(0.9, 0.95))
    for step in range(steps):
        opt.zero_grad()                      # zeros the gradient buckets in place
        for m, (x, y) in enumerate(micro_batches):
            with ddp.no_sync(m < len(micro_batches) - 1):   # communicate on the last only
                (model(x, y) / len(micro_batches)).backward()
        ddp.finish_grad_sync()               # after the last backward, before clipping
        opt.clip_grad_norm(1.0)
        opt.step()

zero=2 (ZeRO-2) also shards the gradients: every micro-batch reduce-scatters each bucket into
persistent shards (no_sync has no effect) and the full buckets are freed. ZeRO-3 shards the
parameters too: fsdp = FullyShardedDataParallel(model); opt = DistributedOptimizer(fsdp, ...);
then fsdp.zero_grad() / fsdp.finish_grad_sync() as above. DistributedOptimizer(...,
offload=True) keeps the shard's optimizer state in host memory (docs/memory.md).

Without ZeRO (zero=False) use any optimizer on the full parameters after finish_grad_sync(),
e.g. td.optim.AdamW, but zero gradients with ddp.zero_grad() (or zero_grad(set_to_none=False)):
every .grad is a view of a bucket and must never be set to None. The C++ classes
(include/tardelli/distributed/data_parallel.h, distributed_optimizer.h) hold the behaviour;
this module only adapts arguments.
"""
import contextlib

from .. import _C

_D = _C.distributed


def _default_group(group):
    if group is not None:
        return group
    from . import world  # the default group set by td.distributed.init()
    return world()


def _named_params(obj):
    if hasattr(obj, "named_parameters"):
        return [(n, p) for n, p in obj.named_parameters()]
    if isinstance(obj, dict):
        return list(obj.items())
    items = list(obj)
    if not all(isinstance(x, tuple) and len(x) == 2 for x in items):
        raise TypeError("DistributedDataParallel: expected a module, a dict of named parameters "
                        "or a list of (name, tensor) pairs")
    return items


class DistributedDataParallel:
    """Averages gradients over `group` (default: the world) in buckets of `bucket_mb` MB
    (10**6 bytes of fp32 gradient), launched during backward as soon as each is ready.

    module_or_params: a td.nn.Module (e.g. td.models.GPT), a dict name -> parameter or a list
    of (name, parameter) pairs, in registration order (the same on every rank). zero=True
    selects ZeRO-1 (reduce-scatter; use DistributedOptimizer). grad_scale multiplies the local
    gradients before the reduction (expert parameters under expert parallelism: 1 / ep over the
    expert-data-parallel group). compressor: a td.distributed.GradCompressor
    (powersgd_compressor / topk_compressor) that reduces each bucket instead of an all-reduce.
    Calling the wrapper calls the module.
    """

    def __init__(self, module_or_params, group=None, bucket_mb=40, zero=False, overlap=True,
                 average=True, own_bucket=(), grad_scale=1.0, compressor=None):
        if bucket_mb <= 0:
            raise _C.TardelliError(f"DistributedDataParallel: bucket_mb must be > 0, got {bucket_mb}")
        stage = int(zero)
        if stage not in (0, 1, 2):
            raise _C.TardelliError(f"DistributedDataParallel: zero must be 0, 1 or 2, got {zero} "
                                   "(ZeRO-3: td.distributed.FullyShardedDataParallel)")
        self.module = module_or_params if hasattr(module_or_params, "named_parameters") else None
        self.group = _default_group(group)
        self.zero = stage
        named = _named_params(module_or_params)
        self.param_names = [n for n, _ in named]  # DDP order (the C++ params() order)
        self._cpp = _D.DistributedDataParallel(
            named, self.group, max(1, int(round(bucket_mb * 1e6))),
            bool(overlap), stage >= 1, bool(average), stage == 2, list(own_bucket),
            float(grad_scale), compressor)
        self.compressor = compressor

    @classmethod
    def _from_cpp(cls, cpp, names, group, zero, module=None):
        self = cls.__new__(cls)
        self.module, self.group, self.zero, self.param_names, self._cpp = \
            module, group, zero, names, cpp
        self.compressor = None
        return self

    def __call__(self, *args, **kwargs):
        if self.module is None:
            raise TypeError("DistributedDataParallel was built from parameters, not a module")
        return self.module(*args, **kwargs)

    def set_last_microbatch(self, last):
        """False: backward only accumulates (no communication); True: buckets reduce in backward."""
        self._cpp.set_last_microbatch(bool(last))

    @property
    def is_last_microbatch(self):
        return self._cpp.is_last_microbatch()

    @property
    def overlap(self):
        """Whether buckets are reduced during backward (settable between steps)."""
        return self._cpp.overlap()

    @overlap.setter
    def overlap(self, on):
        self._cpp.set_overlap(bool(on))

    @contextlib.contextmanager
    def no_sync(self, enabled=True):
        """Within the scope backward only accumulates gradients (torch's DDP.no_sync)."""
        prev = self._cpp.is_last_microbatch()
        self._cpp.set_last_microbatch(not enabled)
        try:
            yield
        finally:
            self._cpp.set_last_microbatch(prev)

    def finish_grad_sync(self):
        """Waits for every bucket (launching those not yet launched); then every gradient is
        the mean over the group (ZeRO-1: this rank's shard of it)."""
        self._cpp.finish_grad_sync()

    def zero_grad(self, set_to_none=False):
        if set_to_none:
            raise _C.TardelliError("DistributedDataParallel.zero_grad: gradients are views of "
                                   "the buckets and cannot be set to None")
        self._cpp.zero_grad()

    @property
    def num_buckets(self):
        return self._cpp.num_buckets

    def bucket_param_names(self):
        return self._cpp.bucket_param_names()

    def num_collectives(self):
        return self._cpp.num_collectives()

    def last_wait_seconds(self):
        """Seconds the last finish_grad_sync() waited: communication not hidden by backward."""
        return self._cpp.last_wait_seconds()


class DistributedOptimizer:
    """ZeRO-1 AdamW: each rank keeps fp32 master weights and moments for its 1/dp shard only.

    param_groups: torch-style dicts ({"params": [...], "weight_decay": 0.1, "lr": ...}) or a
    list of tensors; every parameter of the DDP must appear in exactly one group.
    `self.param_groups[i]["lr"]` (and "weight_decay") may be changed between steps.
    """

    def __init__(self, ddp, param_groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, offload=False):
        fsdp = None
        if isinstance(ddp, FullyShardedDataParallel):
            fsdp = ddp._cpp
            ddp = ddp.ddp
        if not isinstance(ddp, DistributedDataParallel):
            raise TypeError("DistributedOptimizer: expected a td.distributed.DistributedDataParallel "
                            "or FullyShardedDataParallel")
        if not ddp.zero:
            raise _C.TardelliError("DistributedOptimizer: the DistributedDataParallel must be "
                                   "built with zero=True")
        self.offload = bool(offload)
        groups = list(param_groups)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.ddp = ddp
        self.defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        self.param_groups = []
        specs = []
        for g in groups:
            g = dict(g)
            g["params"] = list(g["params"])
            for k, v in self.defaults.items():
                g.setdefault(k, v)
            b1, b2 = g["betas"]
            specs.append((g["params"], float(g["lr"]), float(g["weight_decay"]),
                          {"beta1": float(b1), "beta2": float(b2), "eps": float(g["eps"])}))
            self.param_groups.append(g)
        self._cpp = _D.DistributedOptimizer(ddp._cpp, specs, float(lr), float(betas[0]),
                                            float(betas[1]), float(eps), float(weight_decay),
                                            self.offload, fsdp)

    def _push_hyperparameters(self):
        for i, g in enumerate(self.param_groups):
            self._cpp.set_group_hyperparameters(i, float(g["lr"]), float(g["weight_decay"]))

    def step(self):
        """AdamW on this rank's shard, then the all-gather of the parameters. Call after
        ddp.finish_grad_sync()."""
        self._push_hyperparameters()
        self._cpp.step()

    def zero_grad(self, set_to_none=False):
        self.ddp.zero_grad(set_to_none)

    def clip_grad_norm(self, max_norm):
        """torch.nn.utils.clip_grad_norm_ on the full averaged gradient; returns the norm."""
        return self._cpp.clip_grad_norm(float(max_norm))

    def grad_norm(self):
        return self._cpp.grad_norm()

    def scale_grads_(self, factor):
        """Multiplies this rank's shard of the averaged gradient by `factor` in place."""
        self._cpp.scale_grads(float(factor))

    def set_model_parallel(self, model, group):
        """Makes the norm that of the full model-parallel model (Note [Model-parallel grad
        norm] in distributed_optimizer.h): `model` is a GPT or this rank's pipeline chunks,
        `group` the tp (or tp-pp) group; parameters split over tp count on every tp rank,
        replicated ones on tp rank 0 only, and the sums are added over `group`."""
        from .model_parallel import _counts
        models = model if isinstance(model, (list, tuple)) else [model]
        owner = {n: m for m in models for n, _ in m.named_parameters()}
        tp = models[0].tp_size > 1
        counted = [_counts(owner[n], n, tp) for n in self.ddp.param_names]
        self._cpp.set_model_parallel(group, counted)

    def optimizer_state_bytes(self):
        """Bytes of this rank's master weights and moments (~ 12 * numel / dp)."""
        return self._cpp.optimizer_state_bytes()

    def host_state_bytes(self):
        """With offload: the bytes of state (and gradient copy) held in host memory."""
        return self._cpp.host_state_bytes()

    def write_masters_to_param_shards(self):
        """ZeRO-3: the parameter shards take the master weights' values (after loading)."""
        self._cpp.write_masters_to_param_shards()

    def state_dict(self):
        """This rank's shard: "<param>.{master,exp_avg,exp_avg_sq}[a:b]" -> tensor, and "step"."""
        return dict(self._cpp.named_state())

    def load_state_dict(self, state):
        self._cpp.load_named_state(dict(state))


class FullyShardedDataParallel:
    """ZeRO-3: every parameter of `chunks` (a td.models.GPT or a list of this rank's pipeline
    chunks) is sharded over `group` between uses; each block is all-gathered before its forward
    and its backward (the next one prefetched) and freed after; gradients are reduce-scattered
    per block into fp32 shards (include/tardelli/distributed/fully_sharded.h); a bf16 model's
    blocks are gathered in bf16 (compute_dtype_gathers). Use with
    DistributedOptimizer(fsdp, ...). `.ddp` is the gradient side (zero_grad, finish_grad_sync)."""

    def __init__(self, chunks, group=None, prefetch=True, compute_dtype_gathers=True):
        models = list(chunks) if isinstance(chunks, (list, tuple)) else [chunks]
        self.group = _default_group(group)
        self.zero = 3
        self._cpp = _D.FullyShardedDataParallel.shard([m._cpp for m in models], self.group,
                                                      bool(prefetch),
                                                      bool(compute_dtype_gathers))
        names = [n for m in models for unit in m._cpp.param_units() for n, _ in unit]
        self.ddp = DistributedDataParallel._from_cpp(self._cpp.ddp(), names, self.group, 2)
        self.param_names = names

    def param_shards(self):
        return self._cpp.param_shards()

    def full_parameters(self):
        """name -> full parameter (a collective over the group)."""
        return dict(self._cpp.full_parameters())

    def load_full_parameters(self, full):
        self._cpp.load_full_parameters(dict(full))

    def zero_grad(self, set_to_none=False):
        self.ddp.zero_grad(set_to_none)

    def finish_grad_sync(self):
        self.ddp.finish_grad_sync()

    def no_sync(self, enabled=True):
        return self.ddp.no_sync(enabled)

    def gathered_bytes(self):
        return self._cpp.gathered_bytes()

    def peak_gathered_bytes(self):
        return self._cpp.peak_gathered_bytes()

    def reset_peak_gathered_bytes(self):
        self._cpp.reset_peak_gathered_bytes()

    def num_gathers(self):
        return self._cpp.num_gathers()


__all__ = ["DistributedDataParallel", "DistributedOptimizer", "FullyShardedDataParallel"]
