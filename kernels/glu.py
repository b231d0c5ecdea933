"""The gated linear unit's activation, as torch computes it: the reference the GLU projections'
Triton epilogue matches, and what a long (prefill) block runs after its projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gate(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up of gate_up [..., 2K] = [gate | up], for "gelu_tanh" or "silu"."""
    g, up = gate_up.chunk(2, dim=-1)
    return (F.gelu(g, approximate="tanh") if activation == "gelu_tanh" else F.silu(g)) * up
