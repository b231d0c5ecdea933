"""A step's positions and RoPE tables: positions start.. (start read on the device, so a CUDA graph
replays at any length) and, for each layer kind, the cos and sin of its frequencies at them in the
model's dtype, as transformers computes them (fp32 angles, rounded once). One kernel on the
Triton path instead of five torch ops a decode step (an arange, an add, a multiply, a cos and a
sin) and nine a verify block (each kind's cos and sin copied out as well).

The frequencies of every kind sit side by side in one vector; `spans` says which columns are
whose. The tables come back as one buffer per function, kind after kind, each kind's [T, width]
contiguous, which the fused kernels read as rows.
"""

from __future__ import annotations

from functools import cache

import torch

from flashdesk.kernels.backend import faulty, use_triton


def rope_reference(
    start: torch.Tensor, count: int, freqs: torch.Tensor, spans: tuple[tuple[int, int], ...], dtype: torch.dtype
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The definition, in torch ops: what `step_rope` returns."""
    positions = start + torch.arange(count, device=start.device)  # int32 + int64: int64
    angles = positions[:, None] * freqs  # int positions times fp32: fp32, as .float() would
    cos = torch.cos(angles, out=torch.empty(angles.shape, dtype=dtype, device=angles.device))
    sin = torch.sin(angles, out=torch.empty(angles.shape, dtype=dtype, device=angles.device))
    return positions, [(cos[:, a:b].contiguous(), sin[:, a:b].contiguous()) for a, b in spans]


def step_rope(
    start: torch.Tensor, count: int, freqs: torch.Tensor, spans: tuple[tuple[int, int], ...], dtype: torch.dtype
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """(positions [count] int64 from start [1], [(cos, sin) [count, b - a] for each span (a, b) of
    the columns of freqs [F] fp32]). The spans cover the columns in order."""
    if use_triton(freqs, "rope"):
        from flashdesk.kernels.rope_triton import step_rope_triton

        positions, tables = step_rope_triton(start, count, freqs, columns(spans, freqs.device), spans, dtype)
        faulty("rope", tables[0])  # an injected fault: the first kind's cos, wrong in place
        return positions, tables
    return rope_reference(start, count, freqs, spans, dtype)


@cache
def columns(spans: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    """Each column's span start and width, [2, F] int32: where the kernel writes it. The spans
    must cover 0..F in order, each kind's columns after the last's."""
    if any(b <= a for a, b in spans) or [a for a, _ in spans] != [0] + [b for _, b in spans[:-1]]:
        raise ValueError(f"RoPE spans must cover the columns in order, one after another: {spans}")
    start = [a for a, b in spans for _ in range(a, b)]
    width = [b - a for a, b in spans for _ in range(a, b)]
    return torch.tensor([start, width], dtype=torch.int32, device=device)
