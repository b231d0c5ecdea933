"""Triton RMSNorm: one program per row, the whole row in one block, so every row is reduced the
same way whatever the number of rows (batch invariant)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import CompileSpec


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, eps, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * inv
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _block(d: int) -> int:
    return triton.next_power_of_2(d)


def _warps(d: int) -> int:
    return 8 if d >= 2048 else 4


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    xc = x.contiguous()
    out = torch.empty_like(xc)
    rows = xc.numel() // d
    if rows:
        w = weight if weight is not None else xc  # unused pointer when there is no weight
        _rms_norm_kernel[(rows,)](xc, w, out, d, eps, HAS_WEIGHT=weight is not None, BLOCK=_block(d),
                                  num_warps=_warps(d))
    return out


def compile_specs() -> list[CompileSpec]:
    """Hidden 2816 (layer norms), head dims 256 and 512 (q/k/v norms), bf16 rows, fp32 weights."""
    specs = []
    for d, has_weight in ((2816, True), (2816, False), (256, True), (256, False), (512, True), (512, False)):
        specs.append(CompileSpec(
            f"rms_norm[D={d},weight={has_weight}]", _rms_norm_kernel,
            {"x_ptr": "*bf16", "w_ptr": "*fp32" if has_weight else "*bf16", "out_ptr": "*bf16", "D": "i32",
             "eps": "fp32", "HAS_WEIGHT": "constexpr", "BLOCK": "constexpr"},
            {"HAS_WEIGHT": has_weight, "BLOCK": _block(d)}, num_warps=_warps(d)))
    return specs
