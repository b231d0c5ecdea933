"""Our Gemma 4 text model for inference: one sequence, a preallocated KV cache, fused projections.

It computes exactly what transformers' Gemma4 computes (docs/model.md, one decoder layer): RMSNorm with a
plain weight, attention scale 1.0, proportional partial RoPE on full layers, weightless v_norm,
k_eq_v, dense MLP and MoE in parallel, layer_scalar, scaled embedding, final softcap. Attention,
linears and MoE go through `flashdesk.kernels` so GPU kernels drop in behind one function each.
It also returns the hidden states after chosen layers, which the DFlash drafter reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashdesk.engine.model.config import Gemma4Config
from flashdesk.engine.model.kv_cache import CacheLayout, KVCache
from flashdesk.kernels.layer_norms import MlpOutWeights, RouterInput, mlp_out_norms, o_proj_and_norms
from flashdesk.kernels.linear import capped_logits, concat_rows, glu_linear, linear
from flashdesk.kernels.moe import DenseMlp, dense_and_routed_moe
from flashdesk.kernels.norm import embed_and_norm
from flashdesk.kernels.qkv import attention_inputs
from flashdesk.kernels.rope import step_rope


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [rows, vocab] fp32, after the softcap
    taps: torch.Tensor | None  # [T, len(taps) * hidden] hidden states after the tapped layers
    hidden: torch.Tensor | None = None  # [rows, hidden] the final norm's output (what the head reads)


class _Layer:
    """The weights of one decoder layer, fused where that saves a matmul."""

    def __init__(self, w: dict, i: int, cfg: Gemma4Config):
        p = f"layers.{i}."
        spec = cfg.layers[i]
        self.spec = spec
        attn = [w.pop(p + "self_attn.q_proj.weight"), w.pop(p + "self_attn.k_proj.weight")]
        if not spec.k_eq_v:
            attn.append(w.pop(p + "self_attn.v_proj.weight"))
        self.qkv = concat_rows(attn)
        self.o_proj = w.pop(p + "self_attn.o_proj.weight")
        self.gate_up = concat_rows([w.pop(p + "mlp.gate_proj.weight"), w.pop(p + "mlp.up_proj.weight")])
        self.down = w.pop(p + "mlp.down_proj.weight")
        self.norms = {
            name: w.pop(p + name + ".weight").float()
            for name in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
                "self_attn.q_norm",
                "self_attn.k_norm",
            )
        }
        self.layer_scalar = w.pop(p + "layer_scalar")
        self.moe = cfg.enable_moe
        if self.moe:
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                self.norms[name] = w.pop(p + name + ".weight").float()
            self.router = w.pop(p + "router.proj.weight")
            self.router_scale = w.pop(p + "router.scale")
            self.per_expert_scale = w.pop(p + "router.per_expert_scale")
            self.experts_gate_up = w.pop(p + "experts.gate_up_proj")
            self.experts_down = w.pop(p + "experts.down_proj")


class Gemma4:
    """The target model. `forward(ids, cache)` runs ids at positions cache.length onwards."""

    def __init__(self, cfg: Gemma4Config, weights: dict[str, torch.Tensor], device, dtype: torch.dtype):
        """Takes ownership of `weights` and empties it, so each layer's unfused tensors are freed
        as soon as they are fused: loading peaks at one layer above the model's size."""
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        w = weights
        self.embed = w.pop("embed_tokens.weight")
        self.embed_scale = torch.tensor(cfg.embed_scale).to(dtype)  # bf16 53.0, not 53.066, as transformers
        self.embed_scale_value = float(self.embed_scale)  # the same number, for kernels (no device read)
        self.final_norm = w.pop("norm.weight").float()
        self.layers = [_Layer(w, i, cfg) for i in range(cfg.num_layers)]
        if w:
            raise ValueError(f"unused weights: {sorted(w)[:5]}")
        # every layer kind's frequencies side by side, each repeated for the rotate-half pairs
        freqs = {kind: spec.inv_freq().repeat(2) for kind, spec in cfg.rope.items()}
        self.rope_freqs = torch.cat(list(freqs.values())).to(self.device)
        ends = torch.tensor([f.numel() for f in freqs.values()]).cumsum(0).tolist()
        self.rope_spans = {kind: (end - f.numel(), end) for (kind, f), end in zip(freqs.items(), ends)}

    def new_cache(self, max_context: int, kv_dtype: str, slack: int = 16) -> KVCache:
        layouts = [
            CacheLayout(s.num_kv_heads, s.head_dim, self.cfg.sliding_window if s.sliding else None)
            for s in self.cfg.layers
        ]
        return KVCache(layouts, max_context, kv_dtype, self.dtype, self.device, slack)

    @torch.inference_mode()
    def forward(
        self, ids: torch.Tensor, cache: KVCache, taps: tuple[int, ...] = (), logits_rows: str = "all"
    ) -> ForwardOutput:
        """Run ids [T] at positions cache.length.. and commit them to the cache.

        logits_rows: "all" for every row (verification), "last" for the last one (prefill/decode).
        """
        out = self.compute(ids, cache, taps, logits_rows)
        cache.advance(ids.shape[0])
        return out

    def compute(
        self, ids: torch.Tensor, cache: KVCache, taps: tuple[int, ...] = (), logits_rows: str = "all"
    ) -> ForwardOutput:
        """`forward` without committing: writes K/V at cache.length.. and returns the outputs. It
        reads the start position from the device (`cache.position`) and decides nothing from tensor
        values, so a decode or verify block can be captured once as a CUDA graph and replayed."""
        cfg = self.cfg
        # positions and each layer kind's cos and sin tables at them (fp32 angles, rounded once)
        spans = tuple(self.rope_spans.values())
        positions, tables = step_rope(cache.position, ids.shape[0], self.rope_freqs, spans, self.dtype)
        rope = dict(zip(self.rope_spans, tables))
        h, x = embed_and_norm(
            ids, self.embed, self.embed_scale_value, self.layers[0].norms["input_layernorm"], cfg.rms_norm_eps
        )
        tapped = {}
        for i, layer in enumerate(self.layers):
            reader = self.layers[i + 1].norms["input_layernorm"] if i + 1 < len(self.layers) else self.final_norm
            h, x = self._layer(i, layer, h, x, reader, positions, rope[layer.spec.kind], cache)
            if i in taps:
                tapped[i] = h
        if logits_rows == "last":
            x = x[-1:]
        logits = capped_logits(x, self.embed, cfg.final_logit_softcapping)  # x: the last layer's final norm
        return ForwardOutput(logits, torch.cat([tapped[t] for t in taps], dim=-1) if taps else None, x)

    def _layer(
        self,
        i: int,
        L: _Layer,
        h,
        x,
        reader: torch.Tensor,
        positions,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
    ):
        """The residual stream h and its input norm x -> the layer's output and its norm by the
        `reader` weight (the next layer's input norm, or the final norm), fused in the last kernel."""
        cfg, eps, n = self.cfg, self.cfg.rms_norm_eps, L.norms
        spec, t = L.spec, h.shape[0]
        q, k, v = attention_inputs(
            x,
            L.qkv,
            n["self_attn.q_norm"],
            n["self_attn.k_norm"],
            *rope,
            eps,
            cfg.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
            spec.k_eq_v,
            cache.block_slots(i, t),
        )
        a = cache.attend(i, q, k, v, positions, scale=1.0)
        # h = residual + norm(o_proj(a)); the dense MLP, the experts and the router each read a norm of h
        router = RouterInput(n["pre_feedforward_layernorm_2"], L.router_scale, cfg.hidden_size**-0.5) if L.moe else None
        h, x, *moe_inputs = o_proj_and_norms(
            a.reshape(t, -1), L.o_proj, h, eps, n["post_attention_layernorm"], n["pre_feedforward_layernorm"], router
        )
        if L.moe:  # the dense MLP and the experts: one pair of launches on the fused path
            m, experts = self._moe(L, DenseMlp(x, L.gate_up, L.down), *moe_inputs)
        else:
            m, experts = linear(glu_linear(x, L.gate_up, "gelu_tanh"), L.down), None
        return mlp_out_norms(
            m,
            experts,
            h,
            eps,
            MlpOutWeights(
                n.get("post_feedforward_layernorm_1"),
                n.get("post_feedforward_layernorm_2"),
                n["post_feedforward_layernorm"],
                L.layer_scalar,
                reader,
            ),
        )

    def _moe(self, L: _Layer, dense: DenseMlp, x: torch.Tensor, router_x: torch.Tensor):
        """The dense MLP and the experts on x (pre_feedforward_layernorm_2 of the residual stream),
        routed on router_x (its weightless norm, scaled): (m, experts) for mlp_out_norms, which
        sums what comes unsummed (moe.dense_and_routed_moe)."""
        return dense_and_routed_moe(
            dense,
            x,
            L.experts_gate_up,
            L.experts_down,
            router_x,
            L.router,
            self.cfg.top_k_experts,
            L.per_expert_scale,
        )
