"""RMSNorm as Gemma 4 defines it: in fp32, times the weight as is (no 1 + w), one cast back.

A norm reduces each row on its own, but torch's reduction kernels choose how to split a row from
the whole tensor's size, so a row's bits could change with the number of rows. The Triton kernel
reduces each row in one program with a fixed block, which keeps verify rows equal to decode rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashdesk.kernels.backend import faulty, use_triton
from flashdesk.kernels.kv_write import KVSlots, kv_write


def rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        y = y * weight
    y = y.to(x.dtype)
    if residual is not None:
        y = residual + y
    return y * scale if scale is not None else y


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., D] normalized over its last dimension; weight [D] fp32 or None. With `residual`
    (like x) the result is residual + norm, then times `scale` (a one-element tensor) if given:
    one kernel instead of three on the Triton path."""
    if use_triton(x, "rms_norm"):
        from flashdesk.kernels.norm_triton import rms_norm_triton

        return faulty("rms_norm", rms_norm_triton(x, weight, eps, residual, scale))
    return rms_norm_reference(x, weight, eps, residual, scale)


def embed_and_norm(
    ids: torch.Tensor, table: torch.Tensor, scale: float, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's first rows: h = table[ids] * scale (a number the table's dtype holds exactly; the
    product rounded as torch's multiply rounds it) and rms_norm(h, weight). One kernel on the
    Triton path instead of the gather, the multiply and the norm. ids are token ids the caller
    checked against the vocabulary."""
    if use_triton(table, "rms_norm") and ids.dim() == 1 and table.dim() == 2:
        from flashdesk.kernels.norm_triton import embed_norm_triton

        return faulty("rms_norm", embed_norm_triton(ids, table, scale, weight, eps))
    h = F.embedding(ids, table) * torch.tensor(scale, dtype=table.dtype)
    return h, rms_norm(h, weight, eps)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half RoPE; x [T, H, D], cos/sin [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def _heads(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, k_eq_v: bool) -> tuple:
    """Views of the q, k and v heads [T, heads, D] in a fused projection [T, (H + Hkv [+ Hkv]) * D]."""
    t, q_size, kv_size = qkv.shape[0], heads * head_dim, kv_heads * head_dim
    q = qkv[:, :q_size].view(t, heads, head_dim)
    k = qkv[:, q_size : q_size + kv_size].view(t, kv_heads, head_dim)
    return q, k, k if k_eq_v else qkv[:, q_size + kv_size :].view(t, kv_heads, head_dim)


def qkv_norms_reference(qkv, q_norm, k_norm, cos, sin, eps, heads, kv_heads, head_dim, k_eq_v):
    q, k, v = _heads(qkv, heads, kv_heads, head_dim, k_eq_v)
    return (
        apply_rope(rms_norm(q, q_norm, eps), cos, sin),
        apply_rope(rms_norm(k, k_norm, eps), cos, sin),
        rms_norm(v, None, eps),
    )


def qkv_norms(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
    k_eq_v: bool,
    into: KVSlots | None = None,
) -> tuple:
    """Gemma 4's attention inputs from its fused projection qkv [T, (H + Hkv [+ Hkv]) * D]:
    q = rope(norm(q) * q_norm), k = rope(norm(k) * k_norm), v = norm(v) without a weight (v is the
    k projection when k_eq_v); cos/sin [T, D]. Returns q [T, H, D], k and v [T, Hkv, D]; with
    `into` k and v are stored in that cache (as kv_write stores them) and returned as None. One
    kernel on the Triton path instead of three norms, two copies, ten elementwise ops and the cache
    write; heads of a size that is not a power of two take those ops."""
    if (
        use_triton(qkv, "head_norms")
        and qkv.dim() == 2
        and qkv.stride(1) == 1
        and (into is None or qkv.shape[0] <= into.capacity and use_triton(qkv, "kv_write"))
    ):
        from flashdesk.kernels.norm_triton import head_norms_triton, heads_fusable

        q, kv = qkv.view(qkv.shape[0], -1, head_dim).split([heads, qkv.shape[1] // head_dim - heads], dim=1)
        if heads_fusable(q, head_dim) and heads_fusable(kv, head_dim):
            q, kv = faulty(
                "head_norms",
                head_norms_triton(
                    q,
                    kv,
                    q_norm,
                    k_norm,
                    cos,
                    sin,
                    eps,
                    kv_heads,
                    "k" if k_eq_v else "norm",
                    weight_after_cast=False,
                    into=into,
                ),
            )
            return (q, None, None) if into is not None else (q, kv[:, :kv_heads], kv[:, kv_heads:])
    q, k, v = qkv_norms_reference(qkv, q_norm, k_norm, cos, sin, eps, heads, kv_heads, head_dim, k_eq_v)
    if into is None:
        return q, k, v
    kv_write(k, v, *into)
    return q, None, None


def qwen_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 RMSNorm (the DFlash drafter's): normalize in fp32, cast back, then scale (the cast
    comes before the weight)."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_qwen_norm(h: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float) -> tuple:
    """(h + y, qwen_rms_norm(h + y)) of rows [T, D] (without y: h and its norm): a residual add and
    the norm that reads the sum, one kernel on the Triton path instead of eight."""
    if use_triton(h, "add_norm") and h.dim() == 2:
        from flashdesk.kernels.norm_triton import add_norm_triton

        return faulty("add_norm", add_norm_triton(h, y, weight, eps))
    total = h if y is None else h + y
    return total, qwen_rms_norm(total, weight, eps)


def drafter_qk_norms(
    q: torch.Tensor | None,
    k: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> tuple:
    """The drafter's rope(qwen_rms_norm(x)) of q [T, H, D] by q_norm (both None: context keys only)
    and k [T, Hkv, D]; one kernel on the Triton path (views of a projection are read in place)."""
    if use_triton(k, "head_norms"):
        from flashdesk.kernels.norm_triton import head_norms_triton, heads_fusable

        if heads_fusable(q, k.shape[-1]) and heads_fusable(k, k.shape[-1]):
            return faulty(
                "head_norms",
                head_norms_triton(q, k, q_norm, k_norm, cos, sin, eps, k.shape[1], "none", weight_after_cast=True),
            )
    q_out: torch.Tensor | None = None
    if q is not None:
        if q_norm is None:
            raise ValueError("drafter_qk_norms: q comes with its q_norm weight")
        q_out = apply_rope(qwen_rms_norm(q, q_norm, eps), cos, sin)
    return q_out, apply_rope(qwen_rms_norm(k, k_norm, eps), cos, sin)


def drafter_store_kv(
    q: torch.Tensor | None,
    kv: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    into: KVSlots,
) -> torch.Tensor | None:
    """drafter_qk_norms of q and of kv's k heads, with k and v (as projected) stored at `into`:
    kv [T, 2 Hkv, D], the k heads then the v heads. Returns q's, or None. One kernel on the Triton
    path for up to the cache's capacity of tokens (else the norms, then kv_write keeps the newest)."""
    heads, d = kv.shape[1] // 2, kv.shape[-1]
    if use_triton(kv, "head_norms") and use_triton(kv, "kv_write") and kv.shape[0] <= into.capacity:
        from flashdesk.kernels.norm_triton import head_norms_triton, heads_fusable

        if heads_fusable(q, d) and heads_fusable(kv, d):
            return faulty(
                "head_norms",
                head_norms_triton(
                    q, kv, q_norm, k_norm, cos, sin, eps, heads, "copy", weight_after_cast=True, into=into
                ),
            )[0]
    q_out, k = drafter_qk_norms(q, kv[:, :heads], q_norm, k_norm, cos, sin, eps)
    kv_write(k, kv[:, heads:], *into)
    return q_out
