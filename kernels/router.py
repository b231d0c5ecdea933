"""Gemma 4's router after its projection: softmax over the experts, top-k, renormalize, times each
chosen expert's scale (docs/model.md, one decoder layer). The torch form is seven ops and a sum of k terms;
on the Triton path it is one small kernel a layer, each row on its own (batch invariant)."""

from __future__ import annotations

import torch

from flashdesk.kernels.backend import faulty, use_triton


def ordered_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dimension in a fixed order, one element at a time: a torch reduction may
    split a row differently with more rows, which would break batch invariance."""
    total = x[..., 0]
    for i in range(1, x.shape[-1]):
        total = total + x[..., i]
    return total


def route_reference(logits: torch.Tensor, top_k: int, per_expert_scale: torch.Tensor):
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top_w, top_idx = torch.topk(probs, top_k, dim=-1)
    return top_w / ordered_sum(top_w).unsqueeze(-1) * per_expert_scale[top_idx], top_idx


def route(logits: torch.Tensor, top_k: int, per_expert_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] fp32, expert ids [T, k] int64), largest first."""
    if use_triton(logits, "router"):
        from flashdesk.kernels.router_triton import route_triton

        return faulty("router", route_triton(logits, top_k, per_expert_scale))
    return route_reference(logits, top_k, per_expert_scale)
