"""What a step must read, counted from the model as it sits in memory: the floor of its time.

At batch 1 a step costs the bytes it reads (docs/performance-model.md): the non-expert
weights it touches (fused linears as stored, int4 counted as packed + scales (+ zeros), norms,
routers, scalars), the embedding rows of its tokens, the whole head (any logits read all of it),
the UNION of experts the routers picked in that step (recorded by wrapping the MoE call the model
makes), and the KV it reads (per layer: the positions visible to the block's last query x KV heads x
head_dim x 2 x bytes per element, + fp8 scales). A draft step reads the drafter's layers, final
norm, head and its context K/V (fc and hidden_norm belong to the context write, not the draft).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from flashdesk.kernels.int4 import weight_nbytes
from flashdesk.kernels.linear import linear

KV_ELEMENT_BYTES = {"fp8": 1, "bfloat16": 2, "float32": 4}
FP8_SCALE_BYTES = 4  # one fp32 scale per (token, KV head), for K and for V


def kv_read_bytes(cfg, kv_dtype: str, start: int, t: int) -> int:
    """KV bytes a forward of t tokens at positions start.. reads: per layer, every key its last query
    sees (full layers: all start + t; sliding: the window, the block's own keys included)."""
    elem = KV_ELEMENT_BYTES[kv_dtype]
    end = start + t
    total = 0
    for spec in cfg.layers:
        lo = max(0, start - cfg.sliding_window + 1) if spec.sliding else 0
        positions = end - lo
        per_position = spec.num_kv_heads * spec.head_dim * elem * 2
        if kv_dtype == "fp8":
            per_position += spec.num_kv_heads * FP8_SCALE_BYTES * 2
        total += positions * per_position
    return total


def draft_kv_bytes(dcfg, context: int, element_size: int) -> int:
    """Context K/V a draft step reads: all of it on full layers, the last window - 1 on sliding ones."""
    total = 0
    for kind in dcfg.layer_kinds:
        held = (
            context
            if kind != "sliding_attention" or dcfg.sliding_window is None
            else min(context, dcfg.sliding_window - 1)
        )
        total += held * dcfg.num_kv_heads * dcfg.head_dim * 2 * element_size
    return total


EXPERT_ATTRS = ("experts_gate_up", "experts_down")


def layer_dense_bytes(layer) -> int:
    """Everything a decoder layer holds except the experts (read whole by every forward)."""
    return sum(weight_nbytes(value) for name, value in vars(layer).items() if name not in EXPERT_ATTRS)


def expert_bytes(layer) -> int:
    """Bytes of ONE expert of this layer (its gate_up and down slices)."""
    gate_up, down = getattr(layer, "experts_gate_up", None), getattr(layer, "experts_down", None)
    if gate_up is None:
        return 0
    return (weight_nbytes(gate_up) + weight_nbytes(down)) // gate_up.shape[0]


@dataclass
class Bytes:
    """What one step reads, by kind."""

    weights: int = 0  # non-expert weights, norms, routers, embedding rows
    experts: int = 0  # the union of experts hit
    head: int = 0
    kv: int = 0
    experts_per_layer: float | None = None  # mean union size over the MoE layers

    @property
    def total(self) -> int:
        return self.weights + self.experts + self.head + self.kv

    def as_dict(self) -> dict:
        return {"weights": self.weights, "experts": self.experts, "head": self.head, "kv": self.kv}


def target_step_bytes(
    model, kv_dtype: str, start: int, t: int, unique_ids: int, experts_hit: dict[int, int] | None
) -> Bytes:
    """Bytes of model.forward over t tokens at start (any logits rows: the head is read whole).

    experts_hit: layer index -> number of distinct experts routed to in this step."""
    b = Bytes()
    b.weights = sum(layer_dense_bytes(layer) for layer in model.layers) + weight_nbytes(model.final_norm)
    b.weights += unique_ids * model.embed.shape[1] * model.embed.element_size()
    b.head = weight_nbytes(model.embed)
    moe_layers = [i for i, layer in enumerate(model.layers) if expert_bytes(layer)]
    if moe_layers:
        hit = experts_hit or {}
        b.experts = sum(hit.get(i, 0) * expert_bytes(model.layers[i]) for i in moe_layers)
        b.experts_per_layer = sum(hit.get(i, 0) for i in moe_layers) / len(moe_layers)
    b.kv = kv_read_bytes(model.cfg, kv_dtype, start, t)
    return b


def draft_step_bytes(drafter, context: int) -> Bytes:
    """Bytes of drafter.draft_logits: its layers, final norm, the head it drafts with, context K/V
    (not fc / hidden_norm: add_context reads those, outside the timed step)."""
    b = Bytes()
    b.weights = sum(weight_nbytes(layer) for layer in drafter.layers) + weight_nbytes(drafter.norm)
    embed = drafter.target.embed
    b.weights += 2 * embed.shape[1] * embed.element_size()  # the block's rows: anchor and mask
    b.head = weight_nbytes(getattr(drafter, "head", embed))
    b.kv = draft_kv_bytes(drafter.cfg, context, torch.empty((), dtype=drafter.dtype).element_size())
    return b


class RouterRecorder:
    """Wraps the MoE call of flashdesk.engine.model.gemma4 to keep each layer's router input (a
    reference, nothing computed in the timed step); `union` projects it on the router and takes the
    top-k afterwards."""

    def __init__(self, model):
        self.layer_of = {
            id(layer.experts_gate_up): i
            for i, layer in enumerate(model.layers)
            if getattr(layer, "experts_gate_up", None) is not None
        }
        self.moe_layers = sorted(self.layer_of.values())
        self.calls: list[tuple[int | None, torch.Tensor, torch.Tensor, int]] = []  # layer, router input and weight, k

    @contextmanager
    def active(self):
        from flashdesk.engine.model import gemma4

        original = gemma4.dense_and_routed_moe

        def recording(dense, x, gate_up, down, router_x, router, top_k, *args, **kwargs):
            self.calls.append((self.layer_of.get(id(gate_up)), router_x, router, top_k))
            return original(dense, x, gate_up, down, router_x, router, top_k, *args, **kwargs)

        gemma4.dense_and_routed_moe = recording
        try:
            yield self
        finally:
            gemma4.dense_and_routed_moe = original

    def reset(self) -> None:
        self.calls = []

    def union(self) -> dict[int, int] | None:
        """Layer -> distinct experts over every call since reset (None if the MoE call was not seen):
        each token's top-k of its logits (the softmax keeps their order)."""
        if not self.calls:
            return None
        ids: dict[int, list] = {}
        for n, (layer, router_x, router, top_k) in enumerate(self.calls):
            if layer is None and self.moe_layers:  # experts not passed as stored: layers run in order
                layer = self.moe_layers[n % len(self.moe_layers)]
            if layer is None:  # no layer holds experts: nothing to count them for
                continue
            logits = linear(router_x, router).float()
            ids.setdefault(layer, []).append(torch.topk(logits, top_k, dim=-1).indices.reshape(-1))
        return {layer: int(torch.unique(torch.cat(parts)).numel()) for layer, parts in ids.items()}
