"""Triton RMSNorm: each row reduced whole in one block of a fixed shape, so every row is reduced
the same way whatever the number of rows (batch invariant). Narrow rows (head norms of small
models) go several to a program; how many depends on the row width only.

Gemma 4's q/k/v head norms (q and k with their rotate-half RoPE, v without a weight) run as one
kernel reading the heads straight from the fused qkv projection, rounding where the unfused torch
ops round (norm, the two RoPE products, their sum). The plain norm also fuses a residual add and a
scale, for the unfused forms of `layer_norms`' chains.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import LAUNCH_STAGES, CompileSpec

TILE = 4096  # elements per program: one 2816-wide hidden row (padded), or several narrow rows


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, res_ptr, scale_ptr, out_ptr, R, D, eps, HAS_WEIGHT: tl.constexpr,
                     HAS_RESIDUAL: tl.constexpr, HAS_SCALE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """out = norm(x) * w [+ residual] [* scale], rounded to the output type after each step."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    at = rows[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    y = x * inv[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    out_ty = out_ptr.dtype.element_ty
    if HAS_RESIDUAL:
        y = y.to(out_ty).to(tl.float32) + tl.load(res_ptr + at, mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        y = y.to(out_ty).to(tl.float32) * tl.load(scale_ptr).to(tl.float32)
    tl.store(out_ptr + at, y.to(out_ty), mask=mask)


@triton.jit
def _qkv_norms_kernel(qkv_ptr, q_w_ptr, k_w_ptr, cos_ptr, sin_ptr, q_ptr, kv_ptr, R, eps, H: tl.constexpr,
                      KVH: tl.constexpr, K_EQ_V: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr):
    """Rows are the (token, head) pairs of qkv [T, HEADS * D], heads q (H), k (KVH), v (KVH, none
    with K_EQ_V). q heads: rope(norm(x) * q_w) into q [T, H, D]; k heads: rope(norm(x) * k_w) into
    kv [T, 2 KVH, D] at j - H; v heads: norm(x) into kv at j - H too, or with K_EQ_V the k heads'
    norm(x) at j - H + KVH. RoPE is y * cos + rotate_half(y) * sin with cos/sin [T, D]."""
    HEADS: tl.constexpr = H + KVH if K_EQ_V else H + 2 * KVH
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    half = D // 2
    partner = tl.where(cols < half, cols + half, cols - half)
    ok = (rows < R)[:, None]
    t, j = rows // HEADS, rows % HEADS
    is_q, is_k = (j < H)[:, None], ((j >= H) & (j < H + KVH))[:, None]
    x = tl.load(qkv_ptr + (rows * D)[:, None] + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    xp = tl.load(qkv_ptr + (rows * D)[:, None] + partner[None, :], mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    n, n_partner = x * inv[:, None], xp * inv[:, None]
    out_ty = q_ptr.dtype.element_ty
    w = tl.where(is_q, tl.load(q_w_ptr + cols)[None, :], tl.load(k_w_ptr + cols)[None, :])
    wp = tl.where(is_q, tl.load(q_w_ptr + partner)[None, :], tl.load(k_w_ptr + partner)[None, :])
    y = (n * w).to(out_ty).to(tl.float32)
    yp = (n_partner * wp).to(out_ty).to(tl.float32)
    yp = tl.where((cols < half)[None, :], -yp, yp)  # rotate_half: [-y2, y1]
    table = t[:, None] * D + cols[None, :]
    c = tl.load(cos_ptr + table, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + table, mask=ok, other=0.0).to(tl.float32)
    roped = ((y * c).to(out_ty).to(tl.float32) + (yp * s).to(out_ty).to(tl.float32)).to(out_ty)
    tl.store(q_ptr + ((t * H + j) * D)[:, None] + cols[None, :], roped, mask=ok & is_q)
    kv_row = t * (2 * KVH) + j - H
    tl.store(kv_ptr + (kv_row * D)[:, None] + cols[None, :], roped, mask=ok & is_k)
    if K_EQ_V:
        v_at, is_v = kv_row + KVH, is_k
    else:
        v_at, is_v = kv_row, (j >= H + KVH)[:, None]
    tl.store(kv_ptr + (v_at * D)[:, None] + cols[None, :], n.to(out_ty), mask=ok & is_v)


def _shape(d: int) -> tuple[int, int, int]:
    """(rows per program, block, warps) from the row width alone."""
    block = triton.next_power_of_2(d)
    return max(1, TILE // block), block, 8 if block >= 2048 else 4


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None = None,
                    scale: torch.Tensor | None = None) -> torch.Tensor:
    d = x.shape[-1]
    xc = x.contiguous()
    out = torch.empty_like(xc)
    rows = xc.numel() // d
    if rows:
        per_program, block, warps = _shape(d)
        res = residual.contiguous() if residual is not None else xc  # unused pointers stand in for absent ones
        _rms_norm_kernel[(triton.cdiv(rows, per_program),)](
            xc, weight if weight is not None else xc, res, scale if scale is not None else xc, out, rows, d, eps,
            HAS_WEIGHT=weight is not None, HAS_RESIDUAL=residual is not None, HAS_SCALE=scale is not None,
            ROWS=per_program, BLOCK=block, num_warps=warps, num_stages=LAUNCH_STAGES)
    return out


def qkv_fusable(qkv: torch.Tensor, head_dim: int) -> bool:
    """A projection the fused kernel reads: contiguous rows of power-of-two heads (Gemma 4's 256, 512)."""
    return qkv.dim() == 2 and qkv.is_contiguous() and head_dim == triton.next_power_of_2(head_dim)


def qkv_norms_triton(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, eps: float, heads: int, kv_heads: int, head_dim: int, k_eq_v: bool) -> tuple:
    """`norm.qkv_norms` for a projection `qkv_fusable` accepts: q [T, H, D] and k, v [T, Hkv, D],
    the two of them views of one [T, 2 Hkv, D] tensor (the K/V write reads any row stride)."""
    t, d = qkv.shape[0], head_dim
    heads_in = heads + kv_heads * (1 if k_eq_v else 2)
    if not qkv_fusable(qkv, d) or qkv.shape[1] != heads_in * d:
        raise ValueError(f"qkv_norms needs contiguous rows of {heads_in} heads of a power-of-two size, got "
                         f"{tuple(qkv.shape)} with head dim {d}")
    q = torch.empty((t, heads, d), dtype=qkv.dtype, device=qkv.device)
    kv = torch.empty((t, 2 * kv_heads, d), dtype=qkv.dtype, device=qkv.device)
    if t:
        per_program, _, warps = _shape(d)
        _qkv_norms_kernel[(triton.cdiv(t * heads_in, per_program),)](
            qkv, q_norm, k_norm, cos.contiguous(), sin.contiguous(), q, kv, t * heads_in, eps, H=heads, KVH=kv_heads,
            K_EQ_V=k_eq_v, D=d, ROWS=per_program, num_warps=warps, num_stages=LAUNCH_STAGES)
    return q, kv[:, :kv_heads], kv[:, kv_heads:]


def compile_specs() -> list[CompileSpec]:
    """Hidden 2816 (layer norms, the router's; fused with the residual add, and with the layer
    scalar), head dims 256 and 512 (v norms without a weight; q/k norms fused with RoPE), bf16 rows,
    fp32 weights."""
    specs = []
    variants = [(2816, True, False, False), (2816, False, False, False), (256, False, False, False),
                (512, False, False, False), (2816, True, True, False), (2816, True, True, True)]
    for d, has_weight, has_residual, has_scale in variants:
        per_program, block, warps = _shape(d)
        flags = {"HAS_WEIGHT": has_weight, "HAS_RESIDUAL": has_residual, "HAS_SCALE": has_scale,
                 "ROWS": per_program, "BLOCK": block}
        fused = (",residual" if has_residual else "") + (",scale" if has_scale else "")
        name = f"rms_norm[D={d},weight={has_weight}{fused}]"
        specs.append(CompileSpec(
            name, _rms_norm_kernel,
            {"x_ptr": "*bf16", "w_ptr": "*fp32" if has_weight else "*bf16", "res_ptr": "*bf16",
             "scale_ptr": "*bf16", "out_ptr": "*bf16", "R": "i32", "D": "i32", "eps": "fp32",
             **dict.fromkeys(flags, "constexpr")}, flags, num_warps=warps))
    # sliding layers (16 q, 8 k, 8 v heads of 256); full layers (16 q, 2 k heads of 512; v = k, or its own)
    for heads, kv_heads, d, k_eq_v in ((16, 8, 256, False), (16, 2, 512, True), (16, 2, 512, False)):
        per_program, _, warps = _shape(d)
        flags = {"H": heads, "KVH": kv_heads, "K_EQ_V": k_eq_v, "D": d, "ROWS": per_program}
        specs.append(CompileSpec(
            f"qkv_norms[D={d},H={heads},KVH={kv_heads}{',k_eq_v' if k_eq_v else ''}]", _qkv_norms_kernel,
            {"qkv_ptr": "*bf16", "q_w_ptr": "*fp32", "k_w_ptr": "*fp32", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
             "q_ptr": "*bf16", "kv_ptr": "*bf16", "R": "i32", "eps": "fp32", **dict.fromkeys(flags, "constexpr")},
            flags, num_warps=warps))
    return specs
