"""Triton RMSNorm: each row reduced whole in one block of a fixed shape, so every row is reduced
the same way whatever the number of rows (batch invariant). Narrow rows (head norms of small
models) go several to a program; how many depends on the row width only.

Two fusions cut a Gemma 4 layer's launches (PERFORMANCE-MODEL.md: ~9 norms a layer, and the glue
around them): a norm whose output is added to the residual stream (and scaled by the layer scalar)
in the same kernel, and the q/k head norms with their rotate-half RoPE, read straight from the
fused qkv projection. Each rounds where the unfused torch ops round (norm, add, scale; norm, the
two products, their sum), so the result is the one those ops give, up to the norm's own reduction.
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
def _rms_norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, R, H, stride_t, eps, D: tl.constexpr,
                          ROWS: tl.constexpr):
    """Rows are (token, head) pairs of x[t, h, :] = x_ptr[t * stride_t + h * D :]; out [R, D] is
    rope(norm(x) * w) with cos/sin [T, D] of each row's token: y * cos + rotate_half(y) * sin."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    half = D // 2
    partner = tl.where(cols < half, cols + half, cols - half)
    ok = (rows < R)[:, None]
    t = rows // H
    base = (t * stride_t + (rows % H) * D)[:, None]
    x = tl.load(x_ptr + base + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    xp = tl.load(x_ptr + base + partner[None, :], mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    out_ty = out_ptr.dtype.element_ty
    y = (x * inv[:, None] * tl.load(w_ptr + cols).to(tl.float32)[None, :]).to(out_ty).to(tl.float32)
    yp = (xp * inv[:, None] * tl.load(w_ptr + partner).to(tl.float32)[None, :]).to(out_ty).to(tl.float32)
    yp = tl.where((cols < half)[None, :], -yp, yp)  # rotate_half: [-y2, y1]
    table = t[:, None] * D + cols[None, :]
    c = tl.load(cos_ptr + table, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + table, mask=ok, other=0.0).to(tl.float32)
    y = (y * c).to(out_ty).to(tl.float32) + (yp * s).to(out_ty).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * D + cols[None, :], y.to(out_ty), mask=ok)


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


def rope_fusable(x: torch.Tensor) -> bool:
    """Heads [T, H, D] the fused kernel reads: contiguous heads (a column slice of a wider row is
    fine) of a power-of-two size (Gemma 4's 256 and 512)."""
    d = x.shape[-1]
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == d and d == triton.next_power_of_2(d)


def rms_norm_rope_triton(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         eps: float) -> torch.Tensor:
    """x [T, H, D] as `rope_fusable` describes; cos/sin [T, D]."""
    t, h, d = x.shape
    if not rope_fusable(x):
        raise ValueError(f"rms_norm_rope needs contiguous heads of a power-of-two size, got {tuple(x.shape)} "
                         f"with strides {x.stride()}")
    out = torch.empty((t, h, d), dtype=x.dtype, device=x.device)
    if t:
        per_program, _, warps = _shape(d)
        _rms_norm_rope_kernel[(triton.cdiv(t * h, per_program),)](
            x, weight, cos.contiguous(), sin.contiguous(), out, t * h, h, x.stride(0), eps, D=d, ROWS=per_program,
            num_warps=warps, num_stages=LAUNCH_STAGES)
    return out


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
    for d in (256, 512):
        per_program, _, warps = _shape(d)
        specs.append(CompileSpec(
            f"rms_norm_rope[D={d}]", _rms_norm_rope_kernel,
            {"x_ptr": "*bf16", "w_ptr": "*fp32", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "out_ptr": "*bf16",
             "R": "i32", "H": "i32", "stride_t": "i32", "eps": "fp32", "D": "constexpr", "ROWS": "constexpr"},
            {"D": d, "ROWS": per_program}, num_warps=warps))
    return specs
