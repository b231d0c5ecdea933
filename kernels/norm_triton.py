"""Triton RMSNorm: each row reduced whole in one block of a fixed shape, so every row is reduced
the same way whatever the number of rows (batch invariant). Narrow rows (head norms of small
models) go several to a program; how many depends on the row width only."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import LAUNCH_STAGES, CompileSpec

TILE = 4096  # elements per program: one 2816-wide hidden row (padded), or several narrow rows


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, R, D, eps, HAS_WEIGHT: tl.constexpr, ROWS: tl.constexpr,
                     BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    at = rows[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    y = x * inv[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=mask)


def _shape(d: int) -> tuple[int, int, int]:
    """(rows per program, block, warps) from the row width alone."""
    block = triton.next_power_of_2(d)
    return max(1, TILE // block), block, 8 if block >= 2048 else 4


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    xc = x.contiguous()
    out = torch.empty_like(xc)
    rows = xc.numel() // d
    if rows:
        per_program, block, warps = _shape(d)
        w = weight if weight is not None else xc  # unused pointer when there is no weight
        _rms_norm_kernel[(triton.cdiv(rows, per_program),)](xc, w, out, rows, d, eps, HAS_WEIGHT=weight is not None,
                                                             ROWS=per_program, BLOCK=block, num_warps=warps,
                                                             num_stages=LAUNCH_STAGES)
    return out


def compile_specs() -> list[CompileSpec]:
    """Hidden 2816 (layer norms), head dims 256 and 512 (q/k/v norms), bf16 rows, fp32 weights."""
    specs = []
    for d, has_weight in ((2816, True), (2816, False), (256, True), (256, False), (512, True), (512, False)):
        per_program, block, warps = _shape(d)
        specs.append(CompileSpec(
            f"rms_norm[D={d},weight={has_weight}]", _rms_norm_kernel,
            {"x_ptr": "*bf16", "w_ptr": "*fp32" if has_weight else "*bf16", "out_ptr": "*bf16", "R": "i32",
             "D": "i32", "eps": "fp32", "HAS_WEIGHT": "constexpr", "ROWS": "constexpr", "BLOCK": "constexpr"},
            {"HAS_WEIGHT": has_weight, "ROWS": per_program, "BLOCK": block}, num_warps=warps))
    return specs
