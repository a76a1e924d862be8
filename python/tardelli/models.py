"""tardelli.models: the fused GPT (implemented in C++, include/tardelli/models/gpt.h).

    cfg = td.models.GPTConfig(arch="llama", vocab_size=8192, block_size=256, n_layer=4,
                              n_head=4, n_kv_head=2, d_model=256, dtype="bf16")
    model = td.models.GPT(cfg)
    loss = model(idx, targets)            # mean cross-entropy (fp32 scalar)
    logits = model(idx)                   # [B, T, V] in the compute dtype
    opt = td.optim.AdamW(model.param_groups(weight_decay=0.1), lr=3e-4)
    out = model.generate(idx, 20, temperature=0.8, top_k=50)

GPT is a td.nn.Module whose parameters are the C++ model's own tensors (wrapped as
td.nn.Parameter, Note [Parameter shares the TensorImpl]), so parameters(), state_dict(),
load_state_dict(), zero_grad(), to(dtype) and optimizers act on what the C++ forward reads.
Targets equal to -100 (IGNORE_INDEX, torch's default) are left out of the loss.
"""
import math

from . import _C
from . import nn
from ._tensor import as_dtype

_CConfig = _C.models.GPTConfig
IGNORE_INDEX = _C.models.IGNORE_INDEX

_DTYPE_NAMES = {
    "fp32": _C.dtype.float32, "float32": _C.dtype.float32,
    "bf16": _C.dtype.bfloat16, "bfloat16": _C.dtype.bfloat16,
    "fp16": _C.dtype.float16, "float16": _C.dtype.float16,
}
_SHORT = {_C.dtype.float32: "fp32", _C.dtype.bfloat16: "bf16", _C.dtype.float16: "fp16"}
_DENSE_FIELDS = ("arch", "vocab_size", "block_size", "n_layer", "n_head", "n_kv_head",
                 "d_model", "ffn_hidden", "dropout", "norm_eps", "rope_base", "dtype", "seed")
# Mixture of experts (include/tardelli/models/gpt_config.h, docs/moe.md); num_experts 0: dense.
_MOE_FIELDS = ("num_experts", "moe_top_k", "moe_ffn_hidden", "moe_layer_freq",
               "moe_shared_experts", "moe_norm_topk", "moe_aux_loss_coeff", "moe_z_loss_coeff",
               "moe_router_bias_update_rate", "moe_capacity_factor")
_FIELDS = _DENSE_FIELDS + _MOE_FIELDS


def _as_compute_dtype(dtype):
    if isinstance(dtype, str):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"GPTConfig: unknown dtype '{dtype}' (expected 'fp32', 'bf16' or "
                             "'fp16')")
        return _DTYPE_NAMES[dtype]
    return as_dtype(dtype)


class GPTConfig(_CConfig):
    """The model's configuration, keyword-constructed: arch ("gpt2" | "llama"), vocab_size,
    block_size, n_layer, n_head, n_kv_head (0: = n_head), d_model, ffn_hidden (0: the arch's
    rule), dropout, norm_eps, rope_base, dtype ("fp32" | "bf16" | "fp16", or a td dtype: the
    compute dtype; parameters stay fp32) and seed (initialization). Defaults are GPT-2 small.
    Mixture of experts (docs/moe.md): num_experts (0: dense), moe_top_k, moe_ffn_hidden (0: the
    dense MLP's), moe_layer_freq, moe_shared_experts, moe_norm_topk, moe_aux_loss_coeff,
    moe_z_loss_coeff, moe_router_bias_update_rate, moe_capacity_factor (0: dropless)."""

    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - set(_FIELDS))
        if unknown:
            raise TypeError(f"GPTConfig: unknown field(s) {unknown} (fields: {list(_FIELDS)})")
        if "dtype" in kwargs:
            kwargs["dtype"] = _as_compute_dtype(kwargs["dtype"])
        super().__init__(**kwargs)

    def __setattr__(self, name, value):
        if name == "dtype":
            value = _as_compute_dtype(value)
        super().__setattr__(name, value)

    def to_dict(self):
        """The fields by name (dtype as "fp32"/"bf16"/"fp16"); the MoE fields only for an MoE
        model, as in a checkpoint's meta.json (td.checkpoint.config_to_dict)."""
        d = _config_dict(self)
        d["dtype"] = _SHORT[d["dtype"]]
        return d

    def replace(self, **changes):
        """A copy with some fields changed (dataclasses.replace)."""
        d = self.to_dict()
        d.update(changes)
        return GPTConfig(**d)

    def __eq__(self, other):
        return isinstance(other, _CConfig) and self.diff(other) == ""

    __hash__ = None

    def __repr__(self):
        return "GPTConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"


class _Sub(nn.Module):
    """A node of the parameter tree (Embedding, Block, Linear, ...): holds parameters and
    children only; the computation is the C++ model's."""

    def __init__(self, type_name):
        super().__init__()
        object.__setattr__(self, "_type_name", type_name)

    def _get_name(self):
        return self._type_name

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"{self._type_name} is part of the fused GPT: call the GPT itself")


class GPT(nn.Module):
    """The fused GPT (gpt2 or llama from one config; see include/tardelli/models/gpt.h for the
    math, names, initialization and mixed precision)."""

    def __init__(self, config, stage=None):
        """stage: None for the whole model, or (first_layer, num_layers, pre, post): one
        pipeline stage's part (layers under their global names, the embeddings when pre, ln_f
        and the head when post; include/tardelli/models/gpt.h, GPTStage)."""
        super().__init__()
        if not isinstance(config, _CConfig):
            raise TypeError(f"GPT: expected a td.models.GPTConfig, got {type(config).__name__}")
        cpp = _C.models.GPT(config) if stage is None else _C.models.GPT(
            config, int(stage[0]), int(stage[1]), bool(stage[2]), bool(stage[3]))
        self._adopt(cpp)

    @classmethod
    def _wrap(cls, cpp):
        """A GPT over an existing C++ model (_C.models.GPT), e.g. a pipeline stage built by
        _C.pipeline.build_pipeline_stages."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._adopt(cpp)
        return self

    def _adopt(self, cpp):
        object.__setattr__(self, "_cpp", cpp)
        object.__setattr__(self, "config", GPTConfig(**_config_dict(cpp.config)))
        self._mirror_parameters()

    def _mirror_parameters(self):
        """Mirrors the C++ module tree so names, repr and traversal are the C++ model's (again
        after a parallel layout replaced the tensors by shards: td.distributed.parallelize)."""
        types = dict(self._cpp.named_module_types())
        for name, t in self._cpp.named_parameters():
            mod_path, _, leaf = name.rpartition(".")
            self._node(mod_path, types).register_parameter(leaf, nn.Parameter(t))
        for name, t in self._cpp.named_buffers():  # the MoE routers' expert_bias
            mod_path, _, leaf = name.rpartition(".")
            self._node(mod_path, types).register_buffer(leaf, t)
        if self.config.arch == "gpt2" and self._cpp.stage[3]:
            # Tied head: the same Parameter object under both names, as nanoGPT/HF tie them.
            self._node("lm_head", types).register_parameter("weight", self.wte.weight)

    def _apply(self, fn, floating_only):
        # A buffer (expert_bias) is the C++ model's own tensor: convert it like a parameter, by
        # pointing its TensorImpl at the new data, so the C++ forward sees the result.
        before = [(m, n, b) for m in self.modules() for n, b in m._buffers.items()
                  if b is not None]
        super()._apply(fn, floating_only)
        for m, n, old in before:
            new = m._buffers[n]
            if new is not old:
                old.data = new
                m._buffers[n] = old
        return self

    @property
    def tp_size(self):
        """The tensor-parallel degree of this model's layout (1: not parallelized)."""
        return self._cpp.tp_size

    @property
    def tp_rank(self):
        return self._cpp.tp_rank

    @property
    def cp_size(self):
        """The context-parallel degree (1: every rank holds whole sequences)."""
        return self._cpp.cp_size

    @property
    def sequence_parallel(self):
        return self._cpp.sequence_parallel

    @property
    def ep_size(self):
        """The expert-parallel degree (1: every rank holds every expert)."""
        return self._cpp.ep_size

    @property
    def ep_rank(self):
        """This rank's place in the ep group: it holds experts [ep_rank E/ep, (ep_rank+1) E/ep)."""
        return self._cpp.ep_rank

    @property
    def split_generator(self):
        """The per-tp-rank dropout stream of sequence-parallel regions (None without a layout)."""
        return self._cpp.split_generator

    def shard_spec(self, name):
        """Where this rank's parameter `name` lies in the full tensor: a dict with dim (-1:
        replicated), segments, parts, index (Note [Shard specs], include/tardelli/nn/
        shard_spec.h) and full_shape."""
        dim, segments, parts, index = self._cpp.shard_spec(name)
        return {"dim": dim, "segments": list(segments), "parts": parts, "index": index,
                "full_shape": list(self._cpp.full_shape(name))}

    def _node(self, path, types):
        mod = self
        walked = []
        for part in path.split(".") if path else []:
            walked.append(part)
            if part not in mod._modules:
                mod.add_module(part, _Sub(types.get(".".join(walked), "Module")))
            mod = mod._modules[part]
        return mod

    def forward(self, idx, targets=None):
        """idx [B, T] int64 -> logits [B, T, V]; with targets [B, T] -> the mean loss."""
        return self._cpp.forward(idx, targets)

    @property
    def stage(self):
        """(first_layer, num_layers, pre, post) of this pipeline stage (the whole model:
        (0, n_layer, True, True))."""
        return tuple(self._cpp.stage)

    def forward_stage(self, input, targets=None):  # noqa: A002
        """One pipeline stage's forward: token ids (first stage) or hidden states in; the loss
        (last stage, with targets), else the hidden states to send on."""
        return self._cpp.forward_stage(input, targets)

    def train(self, mode=True):
        super().train(mode)
        self._cpp.train(mode)
        return self

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """Samples max_new_tokens tokens per row with a KV cache; top_k=1 or temperature=0 is
        greedy. Returns [B, T + max_new_tokens] int64. No autograd, no dropout."""
        return self._cpp.generate(idx, int(max_new_tokens), float(temperature),
                                  int(top_k or 0), generator)

    def param_groups(self, weight_decay):
        """torch-style optimizer groups: decay on matrices and embeddings (dim >= 2), none on
        biases and norm weights; every parameter once (the Parameter objects of this module)."""
        by_name = dict(self.named_parameters())
        return [{"params": [by_name[n] for n, _ in g["params"]],
                 "weight_decay": float(g["weight_decay"])}
                for g in self._cpp.param_groups(float(weight_decay))]

    def set_recompute(self, mode="selective", num_layers=None):
        """What each block keeps for backward: "none" (every activation its backward uses),
        "selective" (the default: the MLP activation is recomputed; the flash attention never
        keeps the probabilities) or "full" (only the block's input; the block runs again in
        backward, dropout masks replayed). num_layers (full only): the first num_layers blocks
        of this stage, the rest selective. Values and gradients are the same in every mode
        (Note [Recompute modes], include/tardelli/models/recompute.h)."""
        self._cpp.set_recompute(str(mode), -1 if num_layers is None else int(num_layers))
        return self

    @property
    def recompute(self):
        """(mode, num_layers) set by set_recompute (num_layers -1: every block)."""
        return tuple(self._cpp.recompute)

    def set_fp8(self, history=16, margin=0.0, recipe="hybrid"):
        """The blocks' four linears in FP8 (include/tardelli/ops/fp8.h): inputs and weights in
        e4m3, gradients in e5m2 ("hybrid") or e4m3 ("e4m3"); per-tensor scales from the largest
        amax of the last `history` steps (0: this step's, current scaling) with `margin`. With
        delayed scaling, call commit_fp8() once per optimizer step."""
        self._cpp.set_fp8(int(history), float(margin), str(recipe))
        return self

    def commit_fp8(self):
        """Records the amaxes the step's forwards and backwards noted into every FP8 linear's
        history and updates its scales (once per optimizer step, one rank)."""
        self._cpp.commit_fp8()

    @property
    def fp8(self):
        """Whether set_fp8 was called."""
        return self._cpp.fp8

    @property
    def dropout_generator(self):
        """The td.Generator dropout draws from (its state is part of a training checkpoint)."""
        return self._cpp.dropout_generator

    # ---- mixture of experts (Note [MoE training mode] in include/tardelli/models/moe_mlp.h) ----

    @property
    def num_moe_layers(self):
        """The MoE layers of this model (stage); 0 for a dense model."""
        return len(self._cpp.moe_router_load)

    def moe_stats(self):
        """The MoE statistics summed over the training forwards since reset_moe_stats(): a dict
        with "layers" (per MoE layer: layer (block index), forwards, tokens, tokens_per_expert
        (token-slots routed to each expert, before the capacity), dropped, aux_loss and z_loss
        (unscaled, summed over forwards), max_load and mean_load (token-slots of the busiest
        expert / per expert)) and the means over layers and forwards: aux_loss, z_loss, dropped
        (summed), max_load_ratio (max over layers of max_load / mean_load; 1: balanced)."""
        return self._cpp.moe_stats()

    def take_moe_loss(self):
        """A pipeline stage without the head: the summed MoE loss terms of its last training
        forward (a scalar to backpropagate with the stage's output, with the seed the loss gets),
        then forgotten; None when there are none (Note [MoE losses of a pipeline stage] in
        src/models/gpt.cpp)."""
        return self._cpp.take_moe_loss()

    def reset_moe_stats(self):
        """Clears the statistics and the router loads pending for update_moe_router_bias()."""
        self._cpp.reset_moe_stats()

    def update_moe_router_bias(self):
        """The aux-loss-free balancing step (DeepSeek-V3): each MoE layer's router.expert_bias
        moves by moe_router_bias_update_rate towards the experts loaded below the mean (loads
        of moe_router_load, which are then cleared). A no-op when the rate is 0."""
        self._cpp.update_moe_router_bias()

    @property
    def moe_router_load(self):
        """The loads pending for update_moe_router_bias(): [MoE layer][expert] token-slots (a
        copy). Assign a list of the same shape (e.g. summed over data-parallel ranks) to
        replace them."""
        return self._cpp.moe_router_load

    @moe_router_load.setter
    def moe_router_load(self, load):
        self._cpp.moe_router_load = [[int(x) for x in row] for row in load]

    def matmul_params(self):
        """Weights that take part in a matrix multiply: every parameter with dim >= 2 except the
        token and position embeddings (lookups), plus the tied gpt2 head (wte as a GEMM
        operand), counted once more; the routed experts' weights x top_k / num_experts (the
        share a token uses). A pipeline stage counts its own part."""
        c = self.config
        n = 0
        for name, _ in self._cpp.named_parameters():
            shape = self._cpp.full_shape(name)
            if len(shape) >= 2 and name not in ("wte.weight", "wpe.weight"):
                if ".mlp.experts." in name:
                    # A token goes through top_k of the num_experts stacked experts.
                    n += math.prod(shape) * c.moe_top_k // c.num_experts
                else:
                    n += math.prod(shape)
        return n + (c.vocab_size * c.d_model if c.arch == "gpt2" and self.stage[3] else 0)

    def flops_per_step(self, batch, seq_len):
        """Model FLOPs of one training step (forward + backward) on batch x seq_len tokens, the
        numerator of MFU: 6 x tokens x matmul_params() (multiply-add x forward, input grad,
        weight grad) plus attention: QK^T and AV are 2 x 2 x T^2 x d per sequence and layer
        forward, halved for causality, x 3 for forward + backward = 6 x layers x batch x T^2 x d
        (PaLM's 12 L d T per token, halved). Embedding lookups, norms, softmax and the
        optimizer are not counted. A pipeline stage counts its own layers."""
        c = self.config
        return (6 * self.matmul_params() * batch * seq_len +
                6 * self.stage[1] * batch * seq_len ** 2 * c.d_model)

    def num_parameters(self):
        """Parameters of the full (logical) model, whatever the layout (vocabulary unpadded)."""
        return sum(math.prod(self._cpp.full_shape(n)) for n, _ in self._cpp.named_parameters())

    def local_num_parameters(self):
        """Parameters this rank holds (its shards, padding included)."""
        return self._cpp.num_parameters()

    def extra_repr(self):
        return f"arch={self.config.arch}, dtype={_SHORT[self.config.dtype]}"


def _config_dict(c):
    return {f: getattr(c, f) for f in (_FIELDS if c.num_experts > 0 else _DENSE_FIELDS)}


__all__ = ["GPTConfig", "GPT", "IGNORE_INDEX"]

# GPT.load_hf / GPT.save_hf (Hugging Face GPT-2 interop) live in models_hf.py.
from .models_hf import install as _install_hf  # noqa: E402

_install_hf(GPT)
