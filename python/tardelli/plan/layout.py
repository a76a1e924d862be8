"""The planner's two value objects: the model (ModelSpec, from the train CLI's model flags) and
one parallel layout (Layout), with the train CLI flags of a layout and its validity, decided by
the trainer's own checks (tardelli.train.config.validate) so the planner never proposes a layout
the trainer refuses."""
import dataclasses
import math
from dataclasses import dataclass

from ..train import config as C


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    seq_len: int
    vocab_size: int
    dtype: str = "fp32"
    num_experts: int = 0
    moe_top_k: int = 2
    moe_ffn_hidden: int = 0
    moe_layer_freq: int = 1
    moe_shared_experts: int = 0
    make_vocab_size_divisible_by: int = 128

    @classmethod
    def from_config(cls, cfg):
        kv = cfg.kv_heads or cfg.heads
        if cfg.ffn_hidden:
            ff = cfg.ffn_hidden
        elif cfg.arch == "gpt2":
            ff = 4 * cfg.d_model
        else:
            # src/models/gpt.cpp ffn_hidden_size: 8d/3 rounded up to a multiple of 64.
            ff = (2 * 4 * cfg.d_model // 3 + 63) // 64 * 64
        if cfg.vocab_size <= 0:
            raise C.ConfigError("the planner needs --vocab-size (the model's vocabulary)")
        return cls(cfg.arch, cfg.layers, cfg.d_model, cfg.heads, kv, ff, cfg.seq_len,
                   cfg.vocab_size, cfg.dtype, cfg.num_experts, cfg.moe_top_k,
                   cfg.moe_ffn_hidden or ff, cfg.moe_layer_freq, cfg.moe_shared_experts,
                   cfg.make_vocab_size_divisible_by)

    @property
    def head_dim(self):
        return self.d_model // self.heads

    @property
    def dtype_bytes(self):
        return 4 if self.dtype == "fp32" else 2

    def is_moe(self, layer):
        return self.num_experts > 0 and layer % self.moe_layer_freq == 0

    def padded_vocab(self, tp, cp=1):
        """The vocabulary rows a layout holds in total: padded to a multiple of
        make_vocab_size_divisible_by x tp when the model is laid out over tp or cp
        (parallel/vocab_parallel.h padded_vocab_size); unpadded on one rank."""
        if tp == 1 and cp == 1:
            return self.vocab_size
        m = self.make_vocab_size_divisible_by * tp
        return (self.vocab_size + m - 1) // m * m

    def buffers(self):
        """Element counts of the model's non-parameter tensors: llama's rotary cos and sin
        tables, [seq, head_dim / 2] fp32 each."""
        if self.arch == "gpt2":
            return []
        return [self.seq_len * self.head_dim // 2] * 2

    def total_params(self):
        """Parameters of the logical model (unpadded vocabulary)."""
        return sum(n for _, n in self.stage_params(0, self.layers, True, True, 1, 1, 1))

    def stage_params(self, first, count, pre, post, tp, cp, ep):
        """[(name, elements)] this rank holds of a stage with blocks [first, first + count),
        `pre` (embeddings) and `post` (final norm and head), under tensor parallelism tp and
        expert parallelism ep. Names follow the GPT's parameter names."""
        d, ff, A = self.d_model, self.ffn_hidden, self.d_model
        K = self.kv_heads * self.head_dim
        gpt2 = self.arch == "gpt2"
        V = self.padded_vocab(tp, cp)
        out = []
        if pre:
            out.append(("wte.weight", V // tp * d))
            if gpt2:
                out.append(("wpe.weight", self.seq_len * d))
        for i in range(first, first + count):
            p = f"h.{i}."
            out.append((p + "ln_1.weight", d))
            if gpt2:
                out.append((p + "ln_1.bias", d))
            out.append((p + "attn.c_attn.weight", (A + 2 * K) // tp * d))
            if gpt2:
                out.append((p + "attn.c_attn.bias", (A + 2 * K) // tp))
            out.append((p + "attn.c_proj.weight", d * A // tp))
            if gpt2:
                out.append((p + "attn.c_proj.bias", d))
            out.append((p + "ln_2.weight", d))
            if gpt2:
                out.append((p + "ln_2.bias", d))
            up = 1 if gpt2 else 2  # llama's fused gate/up
            if self.is_moe(i):
                E, fe = self.num_experts // ep, self.moe_ffn_hidden
                out.append((p + "mlp.router.weight", self.num_experts * d))
                out.append((p + "mlp.experts.c_fc.weight", E * up * fe * d))
                out.append((p + "mlp.experts.c_proj.weight", E * d * fe))
                if gpt2:
                    out.append((p + "mlp.experts.c_fc.bias", E * fe))
                    out.append((p + "mlp.experts.c_proj.bias", E * d))
                if self.moe_shared_experts:
                    fs = self.moe_shared_experts * fe
                    out.append((p + "mlp.shared.c_fc.weight", up * fs * d))
                    out.append((p + "mlp.shared.c_proj.weight", d * fs))
            else:
                out.append((p + "mlp.c_fc.weight", up * ff // tp * d))
                if gpt2:
                    out.append((p + "mlp.c_fc.bias", up * ff // tp))
                out.append((p + "mlp.c_proj.weight", d * ff // tp))
                if gpt2:
                    out.append((p + "mlp.c_proj.bias", d))
        if post:
            out.append(("ln_f.weight", d))
            if gpt2:
                out.append(("ln_f.bias", d))
                if not pre:
                    out.append(("wte.weight", V // tp * d))  # the last stage's tied copy
            else:
                out.append(("lm_head.weight", V // tp * d))
        return out


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    micro_batch_size: int = 1
    zero: int = 0
    recompute: str = "selective"
    schedule: str = "1f1b"
    cp_comm: str = "ring"

    @property
    def world(self):
        return self.tp * self.pp * self.dp * self.cp

    def flags(self):
        """The train CLI flags of this layout (the world size is the launcher's --nproc)."""
        f = [f"--tp {self.tp}", f"--pp {self.pp}", f"--cp {self.cp}"]
        if self.pp > 1:
            f.append(f"--schedule {self.schedule}")
        if self.vpp > 1:
            f.append(f"--vpp {self.vpp}")
        if self.cp > 1:
            f.append(f"--cp-comm {self.cp_comm}")
        if self.ep > 1:
            f.append(f"--ep {self.ep}")
        if self.sequence_parallel:
            f.append("--sequence-parallel")
        f += [f"--micro-batch-size {self.micro_batch_size}", f"--zero {self.zero}",
              f"--recompute {self.recompute}"]
        return " ".join(f)

    def apply(self, cfg, global_batch_size):
        """A copy of TrainConfig `cfg` with this layout's fields and the global batch set."""
        return dataclasses.replace(
            cfg, tp=self.tp, pp=self.pp, vpp=self.vpp, cp=self.cp, ep=self.ep,
            sequence_parallel=self.sequence_parallel, micro_batch_size=self.micro_batch_size,
            zero=self.zero, recompute=self.recompute, recompute_layers=0,
            schedule=self.schedule, cp_comm=self.cp_comm, pipeline_layout="",
            global_batch_size=global_batch_size)


def check(layout, cfg, global_batch_size):
    """None if the trainer accepts `layout` for the model of `cfg` at this global batch, else
    the trainer's message (tardelli.train.config.validate, the same check the run makes)."""
    try:
        C.validate(layout.apply(cfg, global_batch_size), layout.dp)
    except C.ConfigError as e:
        return str(e)
    return None


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def microbatches(layout, global_batch_size):
    return global_batch_size // (layout.micro_batch_size * layout.dp)


def stage_layers(spec, layout):
    """Blocks of each virtual stage (even split, as the trainer does without a layout)."""
    v = layout.pp * layout.vpp
    return [spec.layers // v] * v


def log2_int(n):
    return int(round(math.log2(n)))
