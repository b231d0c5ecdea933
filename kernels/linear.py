"""Linear layers: y = x @ W.T for every weight format the engine keeps in memory.

A weight is a dense tensor, an `Int4Weight` (read packed by the Triton W4A16 kernels, dequantized
per call by the plain-torch reference), or a tuple of those whose outputs are concatenated (a
fused projection whose parts could not be concatenated, e.g. one quantized and one not). The
model calls `linear()` and never looks at the format; `kernels.backend` picks Triton or torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from flashdesk.kernels.backend import faulty, use_triton
from flashdesk.kernels.glu import gate
from flashdesk.kernels.int4 import Int4Weight


def linear_reference(x: torch.Tensor, weight) -> torch.Tensor:
    if isinstance(weight, Int4Weight):
        return F.linear(x, weight.dequantize(x.dtype))
    return F.linear(x, weight)


def linear(x: torch.Tensor, weight) -> torch.Tensor:
    """x [..., K] @ W.T -> [..., N]."""
    if isinstance(weight, tuple):
        return torch.cat([linear(x, part) for part in weight], dim=-1)
    if not use_triton(x, "linear"):
        return linear_reference(x, weight)
    from flashdesk.kernels.linear_triton import dense_linear, w4a16_linear

    rows = x.reshape(-1, x.shape[-1])
    y = w4a16_linear(rows, weight) if isinstance(weight, Int4Weight) else dense_linear(rows, weight)
    return faulty("linear", y.view(*x.shape[:-1], y.shape[-1]))


def capped_logits(x: torch.Tensor, weight, softcap: float | None) -> torch.Tensor:
    """fp32 logits x @ W.T, then softcap * tanh(logits / softcap) where a softcap is given (Gemma's
    final logit softcap). On the Triton path a dense head over 1..16 rows caps them in its epilogue:
    no kernels of their own (four torch ops a step otherwise)."""
    if softcap and isinstance(weight, torch.Tensor) and x.dim() == 2 and x.shape[0] <= 16 and use_triton(x, "linear"):
        from flashdesk.kernels.linear_triton import dense_linear

        return faulty("linear", dense_linear(x, weight, softcap=softcap))
    logits = linear(x, weight).float()
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def rows_from(weight, start: int):
    """Output rows start.. of a weight in any of the formats above, as views (nothing copied)."""
    if not isinstance(weight, tuple):
        return weight[start:]
    parts = []
    for part in weight:
        if start < part.shape[0]:
            parts.append(part[start:] if start else part)
        start = max(0, start - part.shape[0])
    return parts[0] if len(parts) == 1 else tuple(parts)


def glu_linear(x: torch.Tensor, gate_up, activation: str) -> torch.Tensor:
    """act(x @ gate.T) * (x @ up.T) for a GLU MLP's stacked [gate; up] weight: [..., N / 2]. On the
    Triton path the projection applies the activation in its epilogue (no kernels of its own, and
    the down projection after it reads a plain input)."""
    if isinstance(gate_up, tuple) or not use_triton(x, "glu_linear"):
        return gate(linear(x, gate_up), activation)
    from flashdesk.kernels.linear_triton import dense_linear, w4a16_linear

    rows = x.reshape(-1, x.shape[-1])
    project = w4a16_linear if isinstance(gate_up, Int4Weight) else dense_linear
    y = project(rows, gate_up, activation)
    return faulty("glu_linear", y.view(*x.shape[:-1], y.shape[-1]))


def concat_rows(parts: list):
    """Stack weights along the output dimension, keeping their format when the parts agree."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)
    if all(isinstance(p, Int4Weight) for p in parts) and len({(p.group_size, p.zero is None) for p in parts}) == 1:
        zero = None if parts[0].zero is None else torch.cat([p.zero for p in parts], dim=-2)
        return Int4Weight(
            torch.cat([p.packed for p in parts], dim=-2),
            torch.cat([p.scale for p in parts], dim=-2),
            zero,
            parts[0].group_size,
        )
    return tuple(parts)
