"""z-lab's DFlash drafter: one pass proposes a whole block of tokens from the target's hidden states.

It has no embedding and no head of its own: the block [last token, mask x K] is embedded with the
target's embedding (times sqrt(hidden) for Gemma, times `input_embedding_scale`) and its logits come
from the target's tied head with the drafter's softcap. Its context is the target's hidden states
after `target_layer_ids`, projected by `fc` + `hidden_norm`; each layer turns that into context K/V
once per accepted token and keeps it (sliding layers in a ring). The block's own K/V are never kept.
Sliding layers are causal within their window; full layers see all context and the whole block.
(docs/model.md, the DFlash drafter.)

`quantize="int4"` packs every drafter linear (fc, q, kv, o, gate_up, down) to symmetric int4 (group 32)
as it loads, and drafts with an int4 copy of the target's embedding as the head, quantized once at
load (0.37 GB + scales instead of the 1.48 GB bf16 head of Gemma 4 26B-A4B). Only the proposals
change: the target keeps its bf16 head and verifies every token, so greedy output stays identical.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flashdesk.engine.model.config import SLIDING, DraftConfig
from flashdesk.engine.model.gemma4 import Gemma4
from flashdesk.engine.model.kv_cache import ring_keeps
from flashdesk.kernels.attention import attention, attention_in_place
from flashdesk.kernels.backend import STEP_FAMILIES, use_triton
from flashdesk.kernels.int4 import Int4Weight, quantize_int4, weight_nbytes
from flashdesk.kernels.kv_write import KVSlots
from flashdesk.kernels.linear import concat_rows, glu_linear, linear, rows_from
from flashdesk.kernels.norm import add_qwen_norm, drafter_qk_norms, drafter_store_kv

QUANTIZATIONS = (None, "int4")  # None: the checkpoint's weights in the target's dtype (bf16)
GROUP_SIZE = 32
HEAD_CHUNK_ROWS = 32768  # the int4 head is quantized and applied this many vocab rows at a time


def resolve_draft_quantize(quantize: str | None, device: torch.device) -> str | None:
    """The drafter's weights as a load asks for them: "auto" (the default) drafts with int4 weights
    and an int4 head on a GPU, where a draft step then reads 0.68 GB instead of 2.3 (a fifth of a
    plain step instead of two thirds); "none" (or None) keeps the checkpoint's bf16, as on the CPU.
    The target verifies every token over its whole vocabulary: outputs never change, only how
    many drafted tokens it accepts (on the demo pair at K = 8, 2.96% fewer)."""
    if quantize == "auto":
        return "int4" if torch.device(device).type == "cuda" else None
    return None if quantize == "none" else quantize


def check_draft_quantize(quantize: str | None) -> None:
    if quantize not in QUANTIZATIONS:
        raise ValueError(
            f"unknown drafter quantization {quantize!r}: the choice is int4 (or none for the checkpoint's bf16)"
        )


def quantize_head(embed: torch.Tensor, group_size: int = GROUP_SIZE) -> Int4Weight:
    """An int4 copy of the (tied) embedding as a head, quantized in row chunks to bound the
    temporary memory (dividing and rounding a 262k vocabulary at once would take gigabytes)."""
    if embed.shape[-1] % group_size:
        raise ValueError(
            f"the target's hidden size {embed.shape[-1]} is not a multiple of {group_size}: "
            "its head cannot be quantized to int4 for the drafter"
        )
    parts = [
        quantize_int4(embed[i : i + HEAD_CHUNK_ROWS], group_size) for i in range(0, embed.shape[0], HEAD_CHUNK_ROWS)
    ]
    return concat_rows(parts) if len(parts) > 1 else parts[0]


def draft_expected_shapes(cfg: DraftConfig) -> dict[str, tuple[int, ...]]:
    d, dh = cfg.hidden_size, cfg.head_dim
    shapes = {"fc.weight": (d, len(cfg.target_layer_ids) * d), "hidden_norm.weight": (d,), "norm.weight": (d,)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (cfg.num_heads * dh, d),
                p + "self_attn.k_proj.weight": (cfg.num_kv_heads * dh, d),
                p + "self_attn.v_proj.weight": (cfg.num_kv_heads * dh, d),
                p + "self_attn.o_proj.weight": (d, cfg.num_heads * dh),
                p + "self_attn.q_norm.weight": (dh,),
                p + "self_attn.k_norm.weight": (dh,),
                p + "mlp.gate_proj.weight": (cfg.intermediate_size, d),
                p + "mlp.up_proj.weight": (cfg.intermediate_size, d),
                p + "mlp.down_proj.weight": (d, cfg.intermediate_size),
            }
        )
    return shapes


class DraftContext:
    """Per-layer context K/V of the drafter for one sequence; `length` positions are held.

    Sliding layers keep rings of window + slack and full layers max_context + slack positions, so
    a draft block's own K/V can be written past `length` and attended in place (the Triton path,
    which reads the start from `position` on the device and can be a CUDA graph); the next
    `add_context` overwrites them with the real context.
    """

    def __init__(self, cfg: DraftConfig, max_context: int, dtype, device, slack: int | None = None):
        self.cfg, self.length = cfg, 0
        self.slack = slack = cfg.block_size if slack is None else slack
        self.max_context = max_context + slack
        self.capacity = [
            self.max_context
            if kind != SLIDING or cfg.sliding_window is None
            else min(self.max_context, cfg.sliding_window + slack)
            for kind in cfg.layer_kinds
        ]
        shape = (cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros((cap, *shape), dtype=dtype, device=device) for cap in self.capacity]
        self.v = [torch.zeros((cap, *shape), dtype=dtype, device=device) for cap in self.capacity]
        self.position = torch.zeros(1, dtype=torch.int32, device=device)  # `length`, for step kernels
        self.high = 0  # one past the highest position written (a draft block writes past `length`)

    def reset(self) -> None:
        self.length = self.high = 0
        self.position.fill_(0)

    def note_block(self, t: int) -> None:
        """A draft block of t tokens is about to be written at `length` (the Triton path does)."""
        self.high = max(self.high, self.length + t)

    def holds_block(self, t: int) -> bool:
        """Whether t positions can be written at `length` without overwriting any held position a
        query at `length` or later still sees (a ring that has wrapped keeps its window plus t)."""
        end = self.length + t
        return end <= self.max_context and all(
            end <= cap or t <= cap - (self.window(i) or 0) for i, cap in enumerate(self.capacity)
        )

    def can_rollback(self, length: int) -> bool:
        return 0 <= length <= self.length and all(
            ring_keeps(length, self.high, cap, self.window(i)) for i, cap in enumerate(self.capacity)
        )

    def rollback(self, length: int) -> None:
        """Forget the context from `length` on (a conversation's divergent tail)."""
        if not self.can_rollback(length):
            raise ValueError(
                f"cannot roll the drafter context back from {self.length} to {length}: its "
                "rings no longer hold that window"
            )
        self.length = length
        self.position.fill_(length)

    def buffers(self) -> list[tuple[torch.Tensor, bool]]:
        """Every stored tensor with whether it is a ring (see KVCache.buffers)."""
        return [(t, cap < self.max_context) for k, v, cap in zip(self.k, self.v, self.capacity) for t in (k, v)]

    def place(self, length: int, high: int) -> None:
        self.length, self.high = length, high
        self.position.fill_(length)

    def window(self, layer: int) -> int | None:
        sliding = self.cfg.layer_kinds[layer] == SLIDING and self.cfg.sliding_window is not None
        return self.cfg.sliding_window if sliding else None

    def slots(self, layer: int) -> KVSlots:
        """Where K/V written at `length` go (a ring keeps the newest `capacity` positions); the
        start is read from the device, so a captured block replays."""
        return KVSlots(self.k[layer], self.v[layer], None, None, self.position, self.capacity[layer])

    def read(self, layer: int, lo: int):
        """K, V and positions of the held context from position lo (clamped to what is held)."""
        lo = max(lo, self.length - self.capacity[layer], 0)
        positions = torch.arange(lo, self.length, device=self.k[layer].device)
        slots = positions % self.capacity[layer]
        return self.k[layer][slots], self.v[layer][slots], positions

    def advance(self, c: int) -> None:
        self.length += c
        self.high = max(self.high, self.length)
        self.position.fill_(self.length)


class Drafter:
    """The DFlash draft model bound to its target (whose embedding is its input and its head)."""

    def __init__(self, cfg: DraftConfig, weights: dict, target: Gemma4, quantize: str | None = None):
        """`weights` may hold dense tensors or Int4Weights (loading.build quantizes while loading);
        with quantize="int4" the dense linears left are quantized here and the head becomes int4."""
        check_draft_quantize(quantize)
        self.cfg, self.target, self.quantize = cfg, target, quantize
        self.device, self.dtype = target.device, target.dtype
        w = weights  # taken over and emptied, as Gemma4 does
        if quantize:  # what loading.build's on-load transform did not pack yet (the target's rule)
            for name, tensor in w.items():
                if isinstance(tensor, torch.Tensor) and tensor.dim() == 2 and tensor.shape[-1] % GROUP_SIZE == 0:
                    w[name] = quantize_int4(tensor, GROUP_SIZE)
        # the drafter's head: the target's tied embedding itself, or an int4 copy of it for drafting only
        self.head = quantize_head(target.embed) if quantize else target.embed
        self.fc = w.pop("fc.weight")
        self.hidden_norm = w.pop("hidden_norm.weight")
        self.norm = w.pop("norm.weight")
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            get = lambda name: w.pop(p + name)  # noqa: E731
            self.layers.append(
                {
                    "in_norm": get("input_layernorm.weight"),
                    "post_norm": get("post_attention_layernorm.weight"),
                    "qkv": concat_rows(
                        [get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight"), get("self_attn.v_proj.weight")]
                    ),
                    "q_norm": get("self_attn.q_norm.weight"),
                    "k_norm": get("self_attn.k_norm.weight"),
                    "o": get("self_attn.o_proj.weight"),
                    "gate_up": concat_rows([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")]),
                    "down": get("mlp.down_proj.weight"),
                }
            )
        exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim
        self.rope_freqs = (1.0 / cfg.rope_theta**exponents).repeat(2).to(self.device)  # rotate-half pairs
        # Gemma targets embed with sqrt(hidden); the drafter was trained on those embeddings
        self.embed_scale = math.sqrt(target.cfg.hidden_size) * cfg.input_embedding_scale

    def nbytes(self) -> int:
        """Weight bytes one draft step reads: fc and hidden_norm (context), every layer, the final
        norm and the head (the whole vocabulary); the few embedding rows of the block are not counted."""
        total = sum(weight_nbytes(t) for t in (self.fc, self.hidden_norm, self.norm, self.head))
        return total + sum(weight_nbytes(t) for layer in self.layers for t in layer.values())

    @property
    def max_draft_length(self) -> int:
        return self.cfg.block_size - 1

    method = "dflash"

    @property
    def default_draft_length(self) -> int:
        """The whole block: one pass drafts it, so a longer draft costs the drafter little more."""
        return self.max_draft_length

    def new_context(self, max_context: int) -> DraftContext:
        return DraftContext(self.cfg, max_context, self.dtype, self.device)

    def _rope(self, positions: torch.Tensor):
        """cos and sin [T, head_dim]: fp32 angles (int positions times fp32 frequencies, as
        .float() would), rounded once into the model's dtype: 3 kernels."""
        angles = positions[:, None] * self.rope_freqs
        cos = torch.cos(angles, out=torch.empty(angles.shape, dtype=self.dtype, device=self.device))
        return cos, torch.sin(angles, out=torch.empty(angles.shape, dtype=self.dtype, device=self.device))

    @torch.inference_mode()
    def add_context(self, ctx: DraftContext, taps: torch.Tensor) -> None:
        """Append the target's tapped hidden states [C, n*D] for the next C positions as context K/V."""
        if taps.shape[0]:
            self.write_context(ctx, taps)
            ctx.advance(taps.shape[0])

    @torch.inference_mode()
    def write_context(self, ctx: DraftContext, taps: torch.Tensor) -> None:
        """The context K/V of taps [C, n*D] written at positions from ctx.position on, without
        holding them (ctx.advance does, for as many rows as were accepted; the next write overwrites
        the rest). The start is read on the device only, so a CUDA graph of it replays anywhere."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        c = taps.shape[0]
        positions = ctx.position + torch.arange(c, device=self.device)
        cos, sin = self._rope(positions)
        _, hidden = add_qwen_norm(linear(taps, self.fc), None, self.hidden_norm, eps)
        heads, q_rows = cfg.num_kv_heads, cfg.num_heads * cfg.head_dim
        for i, layer in enumerate(self.layers):
            kv = linear(hidden, rows_from(layer["qkv"], q_rows)).view(c, 2 * heads, cfg.head_dim)  # no input norm
            drafter_store_kv(None, kv, None, layer["k_norm"], cos, sin, eps, ctx.slots(i))

    @torch.inference_mode()
    def draft_logits(self, ctx: DraftContext, anchor: int | torch.Tensor, k: int) -> torch.Tensor:
        """Logits [k, vocab] (fp32, softcapped) for the k tokens after `anchor`, which sits at ctx.length.

        `anchor` is a token id or a one-element long tensor on the device; a tensor is never read
        back to the host (no sync)."""
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        t = k + 1
        positions = ctx.position + torch.arange(t, device=self.device)
        cos, sin = self._rope(positions)
        ids = torch.full((t,), cfg.mask_token_id, dtype=torch.long, device=self.device)
        if isinstance(anchor, torch.Tensor):
            ids[:1] = anchor.reshape(1)  # a device-side copy
        else:
            ids[0] = anchor
        h = F.embedding(ids, self.target.embed) * self.embed_scale
        _, x = add_qwen_norm(h, None, self.layers[0]["in_norm"], eps)
        for i, layer in enumerate(self.layers):
            qkv = linear(x, layer["qkv"]).view(t, cfg.num_heads + 2 * cfg.num_kv_heads, cfg.head_dim)
            a = self._attend(ctx, i, layer, qkv, cos, sin, positions)
            h, x = add_qwen_norm(h, linear(a.reshape(t, -1), layer["o"]), layer["post_norm"], eps)
            reader = self.layers[i + 1]["in_norm"] if i + 1 < len(self.layers) else self.norm  # fused into the add
            h, x = add_qwen_norm(h, linear(glu_linear(x, layer["gate_up"], "silu"), layer["down"]), reader, eps)
        h = x[1:]  # the final norm of the block's drafts (not the anchor)
        logits = self._head(h).float() * cfg.output_multiplier
        if cfg.final_logit_softcapping:
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _attend(self, ctx: DraftContext, i: int, layer: dict, qkv: torch.Tensor, cos, sin, positions):
        """The block's queries over the held context and the whole block (causal or not per layer),
        from its projection qkv [T, H + 2 Hkv, D]. On the Triton path the norm kernel writes the
        block's K/V into the context stores past `length` and attention reads them in place (no
        host-side shapes); otherwise the context is gathered and joined to the block."""
        cfg, t, eps = self.cfg, qkv.shape[0], self.cfg.rms_norm_eps
        window = ctx.window(i)
        scale = cfg.head_dim**-0.5
        q, kv = qkv[:, : cfg.num_heads], qkv[:, cfg.num_heads :]
        if all(use_triton(q, family) for family in STEP_FAMILIES) and ctx.holds_block(t):
            normed = drafter_store_kv(q, kv, layer["q_norm"], layer["k_norm"], cos, sin, eps, ctx.slots(i))
            assert normed is not None  # a q in, its norms out
            return attention_in_place(
                normed,
                ctx.k[i],
                ctx.v[i],
                None,
                None,
                ctx.position,
                window,
                ctx.capacity[i],
                scale,
                ctx.max_context,
                causal=cfg.causal[i],
            )
        q, kb = drafter_qk_norms(q, kv[:, : cfg.num_kv_heads], layer["q_norm"], layer["k_norm"], cos, sin, eps)
        vb = kv[:, cfg.num_kv_heads :]
        start = ctx.length
        kc, vc, pc = ctx.read(i, 0 if window is None else start - window + 1)
        return attention(
            q,
            torch.cat([kc, kb]),
            torch.cat([vc, vb]),
            positions,
            torch.cat([pc, positions]),
            window,
            scale=scale,
            causal=cfg.causal[i],
        )

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        """h @ head.T; the int4 head in vocab chunks, so a plain-torch dequantization stays small."""
        if use_triton(h, "linear") or not isinstance(self.head, Int4Weight) or self.head.shape[0] <= HEAD_CHUNK_ROWS:
            return linear(h, self.head)
        rows = self.head.shape[0]
        return torch.cat(
            [linear(h, self.head[i : i + HEAD_CHUNK_ROWS]) for i in range(0, rows, HEAD_CHUNK_ROWS)], dim=-1
        )
