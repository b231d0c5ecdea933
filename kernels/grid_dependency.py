"""Programmatic dependent launch (PDL), the kernel's half: on sm_90 and later a kernel launched
with PDL's option may start while the kernel before it in the stream still runs, so its launch and
block scheduling overlap that kernel's tail instead of following it (CUDA programming guide,
"Programmatic Dependent Launch and Synchronization").

Every FlashDesk kernel calls `enter(PDL)` before it loads or stores anything that another kernel
of the step writes. With PDL on, a program waits there until the kernels before it have completed
and their writes are visible (griddepcontrol.wait), so results and their order are those of plain
stream order. It then lets the next kernel launch (griddepcontrol.launch_dependents); that one
waits in turn. PDL is a constexpr because the instructions exist only on sm_90 and later (and not
in Triton's interpreter): backend.pdl_options decides it per device, kernels.check per arch.

Before it waits, a kernel asks L2 for what it reads first from DRAM (`prefetch_rows`): a
weight-streaming kernel its first weight tiles, a norm chain its norm weights and the residual
rows an earlier layer wrote (not what the kernel just before writes: that lands in L2 anyway, and
fetching the old lines would only cost bandwidth). The DRAM latency of those loads then passes
while the kernel before it drains. A prefetch only warms L2 and every write lands in L2, so it can
never return stale data; a kernel still loads nothing before its wait, and prefetches only
addresses inside its tensors, computed from its program id.
"""

from __future__ import annotations

import triton
import triton.language as tl

LINE_BYTES = tl.constexpr(128)  # an L2 cache line


@triton.jit
def enter(PDL: tl.constexpr):
    """Wait for the kernels before, then release the next: before the first load of anything a
    kernel of the step writes."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_rows(rows, first_byte, ROW_BYTES: tl.constexpr, end_byte, PDL: tl.constexpr):
    """Before `enter`, with PDL: ask L2 for ROW_BYTES bytes of each row from byte first_byte
    (clamped below the row's end_byte), `rows` a [R, 1] tensor of pointers to each row's start.
    One `prefetch.global.L2` per 128-byte line and row: no register holds the data and nothing
    waits for it. A prefetch is only a hint: the loads after the wait read L2, where every write
    lands, so what it fetched early is never stale. Weight-streaming callers keep ROW_BYTES to
    their first K steps (a few KB a program): whole slices for every resident program could
    overflow L2 before the loads come. Three ask for all of theirs, each after a chain on one SM
    that leaves DRAM idle: the router (0.7 MB), a decode step's q/k/v projection (13-15 MB, under
    a third of an H200's L2) and the expert kernel's dense-MLP programs (their rows)."""
    if PDL:
        LINES: tl.constexpr = 1 << ((ROW_BYTES + LINE_BYTES - 1) // LINE_BYTES - 1).bit_length()
        at = tl.minimum(first_byte + tl.arange(0, LINES) * LINE_BYTES, end_byte - 1)
        lines = rows.to(tl.pointer_type(tl.int8)) + at[None, :]
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [lines], dtype=tl.int32, is_pure=False, pack=1
        )


@triton.jit
def prefetch_tile(ptr, rows, R, D, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """prefetch_rows of whole rows `rows` ([ROWS] indices, those past R clamped to the last) of a
    [R, D] tensor, D <= BLOCK."""
    size: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    prefetch_rows(ptr + tl.minimum(rows, R - 1)[:, None] * D, 0, BLOCK * size, D * size, PDL)


@triton.jit
def prefetch_vector(ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """prefetch_rows of one vector of n <= BLOCK elements (a norm weight)."""
    size: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    prefetch_rows(ptr + tl.zeros((1, 1), tl.int32), 0, BLOCK * size, n * size, PDL)
