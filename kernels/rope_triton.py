"""Triton kernel of `rope.step_rope`: each program writes its rows' positions and, for every
column, the cos and sin of position x frequency where that column's kind keeps them. No reduction:
every element is computed on its own, so the tables are batch invariant. tl.cos and tl.sin are
libdevice's accurate ones on a GPU (the CUDA math library's cosf and sinf, as torch's), numpy's
under the interpreter."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashdesk.kernels.backend import LAUNCH_STAGES, CompileSpec, pdl_options
from flashdesk.kernels.grid_dependency import enter

# Elements a program: one row of the real model's 768 columns over 8 warps, 4 a thread. libdevice's
# accurate cos and sin reduce a large angle (past ~10^5 radians: a long context's positions) in a
# small local array; with 2 or 4 rows a program ptxas kept it in local memory (8 to 64 bytes a
# thread, and spilled around it at 4 rows).
TILE = 1024
WARPS = 8


@triton.jit(do_not_specialize=["T"])
def _rope_kernel(
    start_ptr,
    freqs_ptr,
    columns_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    T,
    F: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """positions[t] = start + t; column f of row t goes to (kind start a, width w of f's span)
    T * a + t * w + f - a of cos and sin: each kind's [T, w] table contiguous, kind after kind."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    f = tl.arange(0, BLOCK)
    enter(PDL)
    positions = tl.load(start_ptr).to(tl.int64) + rows
    tl.store(pos_ptr + rows, positions, mask=rows < T)
    col = f < F
    freqs = tl.load(freqs_ptr + f, mask=col, other=0.0)
    a = tl.load(columns_ptr + f, mask=col, other=0)
    w = tl.load(columns_ptr + F + f, mask=col, other=0)
    angles = positions.to(tl.float32)[:, None] * freqs[None, :]
    at = T * a[None, :] + rows[:, None] * w[None, :] + (f - a)[None, :]
    ok = (rows < T)[:, None] & col[None, :]
    ty: tl.constexpr = cos_ptr.dtype.element_ty
    tl.store(cos_ptr + at, tl.cos(angles).to(ty), mask=ok)
    tl.store(sin_ptr + at, tl.sin(angles).to(ty), mask=ok)


def _shape(f: int) -> tuple[int, int]:
    """(rows a program, block of columns) for F columns: from F alone."""
    block = triton.next_power_of_2(f)
    return max(1, TILE // block), block


def step_rope_triton(
    start: torch.Tensor,
    count: int,
    freqs: torch.Tensor,
    columns: torch.Tensor,
    spans: tuple[tuple[int, int], ...],
    dtype: torch.dtype,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """`rope.step_rope` on the Triton path; columns: `rope.columns(spans)`."""
    if start.numel() != 1:
        raise ValueError(f"rope: start must be one position, got shape {tuple(start.shape)}")
    if freqs.dim() != 1 or freqs.dtype != torch.float32:
        raise ValueError(f"rope: frequencies must be fp32 [F], got {freqs.dtype} {tuple(freqs.shape)}")
    f = freqs.shape[0]
    if columns.shape != (2, f):
        raise ValueError(f"rope: columns must be [2, {f}], got {tuple(columns.shape)}")
    positions = torch.empty(count, dtype=torch.int64, device=freqs.device)
    cos, sin = (torch.empty(count * f, dtype=dtype, device=freqs.device) for _ in range(2))
    if count:
        rows, block = _shape(f)
        _rope_kernel[(triton.cdiv(count, rows),)](
            start,
            freqs,
            columns,
            positions,
            cos,
            sin,
            count,
            F=f,
            ROWS=rows,
            BLOCK=block,
            num_warps=WARPS,
            num_stages=LAUNCH_STAGES,
            **pdl_options(freqs.device),
        )

    def table(t: torch.Tensor, a: int, b: int) -> torch.Tensor:  # a kind's [count, b - a] rows, contiguous
        return t[count * a : count * b].view(count, b - a)

    return positions, [(table(cos, a, b), table(sin, a, b)) for a, b in spans]


def compile_specs() -> list[CompileSpec]:
    """Gemma 4's 768 columns (256 of the sliding layers, 512 of the full ones), bf16 tables."""
    rows, block = _shape(768)
    signature = {
        "start_ptr": "*i32",
        "freqs_ptr": "*fp32",
        "columns_ptr": "*i32",
        "pos_ptr": "*i64",
        "cos_ptr": "*bf16",
        "sin_ptr": "*bf16",
        "T": "i32",
        "F": "constexpr",
        "ROWS": "constexpr",
        "BLOCK": "constexpr",
    }
    return [CompileSpec("rope[F=768]", _rope_kernel, signature, {"F": 768, "ROWS": rows, "BLOCK": block}, WARPS)]
