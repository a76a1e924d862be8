"""The fused GPT's math in plain PyTorch, reading the same parameter names (a test oracle).

`forward(params, cfg, idx, targets=None)` computes exactly what include/tardelli/models/gpt.h
documents, written the obvious way (materialized attention matrix, explicit causal mask,
repeat_interleave for grouped-query attention, rotate-half RoPE, manual RMSNorm since torch 1.13
has none), so that a mistake in the fused kernels or in the model's wiring shows up as a
mismatch:

  gpt2:  LayerNorm, learned positions, GELU(tanh), biases, head tied to wte.
  llama: RMSNorm, RoPE on q and k, SwiGLU (c_fc rows: gate then up), no biases, GQA
         (query head h reads kv head h // (H / Hkv)), untied lm_head.

`params` maps names (wte.weight, h.0.attn.c_attn.weight, ...) to torch tensors; cfg is a dict
with the GPTConfig fields (`arch`, `n_head`, `n_kv_head`, `norm_eps`, `rope_base`, ...).
"""
import math

import torch
import torch.nn.functional as F


def kv_heads(cfg):
    return cfg["n_kv_head"] or cfg["n_head"]


def rope_tables(T, hd, base, dtype):
    """cos/sin [T, hd/2]: angle t * base^(-2i/hd)."""
    inv = base ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rope(x, cos, sin):
    """x [B, T, H, D]: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) on halves."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _norm(cfg, x, p, prefix):
    if cfg["arch"] == "gpt2":
        return F.layer_norm(x, (x.shape[-1],), p[prefix + ".weight"], p[prefix + ".bias"],
                            cfg["norm_eps"])
    return rms_norm(x, p[prefix + ".weight"], cfg["norm_eps"])


def _linear(x, p, prefix):
    return F.linear(x, p[prefix + ".weight"], p.get(prefix + ".bias"))


def forward(p, cfg, idx, targets=None):
    gpt2 = cfg["arch"] == "gpt2"
    B, T = idx.shape
    d, H = cfg["d_model"], cfg["n_head"]
    Hkv, hd = kv_heads(cfg), cfg["d_model"] // cfg["n_head"]
    x = p["wte.weight"][idx]
    if gpt2:
        x = x + p["wpe.weight"][:T]
    if not gpt2:
        cos, sin = rope_tables(T, hd, cfg["rope_base"], x.dtype)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layer"]):
        pre = f"h.{i}."
        h = _norm(cfg, x, p, pre + "ln_1")
        qkv = _linear(h, p, pre + "attn.c_attn")
        q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q, k, v = q.view(B, T, H, hd), k.view(B, T, Hkv, hd), v.view(B, T, Hkv, hd)
        if not gpt2:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if Hkv != H:
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + _linear(y, p, pre + "attn.c_proj")
        h = _norm(cfg, x, p, pre + "ln_2")
        if gpt2:
            m = F.gelu(_linear(h, p, pre + "mlp.c_fc"), approximate="tanh")
        else:
            g, u = _linear(h, p, pre + "mlp.c_fc").chunk(2, dim=-1)
            m = F.silu(g) * u
        x = x + _linear(m, p, pre + "mlp.c_proj")
    x = _norm(cfg, x, p, "ln_f")
    logits = F.linear(x, p["wte.weight"] if gpt2 else p["lm_head.weight"])
    if targets is None:
        return logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-100)


def param_groups(params, weight_decay):
    """The same grouping as GPT.param_groups: decay on dim >= 2, none on the rest."""
    return [{"params": [t for t in params.values() if t.dim() >= 2], "weight_decay": weight_decay},
            {"params": [t for t in params.values() if t.dim() < 2], "weight_decay": 0.0}]
