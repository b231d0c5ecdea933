"""RMSNorm as Gemma 4 defines it: in fp32, times the weight as is (no 1 + w), one cast back.

A norm reduces each row on its own, but torch's reduction kernels choose how to split a row from
the whole tensor's size, so a row's bits could change with the number of rows. The Triton kernel
reduces each row in one program with a fixed block, which keeps verify rows equal to decode rows.
"""

from __future__ import annotations

import torch

from flashdesk.kernels.backend import use_triton


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None,
                       scale: torch.Tensor | None = None) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight
    y = y.to(x.dtype)
    if residual is not None:
        y = residual + y
    return y * scale if scale is not None else y


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None,
             scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., D] normalized over its last dimension; weight [D] fp32 or None. With `residual`
    (like x) the result is residual + norm, then times `scale` (a one-element tensor) if given:
    one kernel instead of three on the Triton path."""
    if use_triton(x):
        from flashdesk.kernels.norm_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual, scale)
    return rms_norm_reference(x, weight, eps, residual, scale)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half RoPE; x [T, H, D], cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def qkv_norms_reference(qkv, q_norm, k_norm, cos, sin, eps, heads, kv_heads, head_dim, k_eq_v):
    t = qkv.shape[0]
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    q = qkv[:, :q_size].view(t, heads, head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(t, kv_heads, head_dim)
    v = k if k_eq_v else qkv[:, q_size + kv_size:].view(t, kv_heads, head_dim)
    return (apply_rope(rms_norm(q, q_norm, eps), cos, sin), apply_rope(rms_norm(k, k_norm, eps), cos, sin),
            rms_norm(v, None, eps))


def qkv_norms(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              eps: float, heads: int, kv_heads: int, head_dim: int, k_eq_v: bool) -> tuple:
    """Gemma 4's attention inputs from its fused projection qkv [T, (H + Hkv [+ Hkv]) * D]:
    q = rope(norm(q) * q_norm), k = rope(norm(k) * k_norm), v = norm(v) without a weight (v is the
    k projection when k_eq_v); cos/sin [T, D]. Returns q [T, H, D], k and v [T, Hkv, D]. One kernel
    on the Triton path instead of three norms, two copies and ten elementwise ops; heads of a size
    that is not a power of two take those ops."""
    if use_triton(qkv):
        from flashdesk.kernels.norm_triton import qkv_fusable, qkv_norms_triton

        if qkv_fusable(qkv, head_dim):
            return qkv_norms_triton(qkv, q_norm, k_norm, cos, sin, eps, heads, kv_heads, head_dim, k_eq_v)
    return qkv_norms_reference(qkv, q_norm, k_norm, cos, sin, eps, heads, kv_heads, head_dim, k_eq_v)
