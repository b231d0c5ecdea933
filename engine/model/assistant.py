"""Gemma 4's MTP assistant (`gemma4_assistant`): a small dense Gemma 4 whose layers compute queries
only and attend over the K/V the target already holds, drafting one token a step from one position.

One draft step, as transformers' Gemma4AssistantForCausalLM computes it (docs/model.md):
- the input is the target's embedding of the last token (scaled, as the target embeds) beside a
  hidden state of the target's width, projected to the assistant's (`pre_projection`);
- each layer: its input norm, q_proj, q_norm, RoPE at the step's position, attention over the
  target's K/V of the layer's kind (full layers: every position given; sliding layers: the last
  `sliding_window` + 1 of those given, as transformers' flipped bidirectional window mask has
  it), o_proj, and the Gemma 4 norms, dense MLP and layer scalar;
- the final norm; logits from the tied embedding, no softcap (with ordered embeddings: only over
  the tokens of the top centroids, the others at the smallest of those logits minus one);
- `post_projection` maps the normed state back to the target's width: the next step's hidden state.

The rounds around it (which K/V, which hidden state, which position) belong to the decode loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from flashdesk.engine.errors import ConfigError
from flashdesk.engine.model.config import SLIDING, Gemma4Config, parse_config, read_json
from flashdesk.kernels.attention import attention
from flashdesk.kernels.linear import concat_rows, glu_linear, linear
from flashdesk.kernels.norm import apply_rope, rms_norm

MODEL_TYPE = "gemma4_assistant"


@dataclass(frozen=True)
class AssistantConfig:
    """The assistant's own layers (`text`, a Gemma 4 text config whose every layer reuses the
    target's K/V) and how it meets the target."""

    text: Gemma4Config
    backbone_hidden_size: int  # the target's hidden size
    use_ordered_embeddings: bool
    num_centroids: int
    centroid_top_k: int

    @property
    def tokens_per_centroid(self) -> int:
        return self.text.vocab_size // self.num_centroids


def is_assistant_config(raw: dict) -> bool:
    return raw.get("model_type") == MODEL_TYPE or "Gemma4AssistantForCausalLM" in (raw.get("architectures") or [])


def parse_assistant_config(raw: dict, source: str = "config.json") -> AssistantConfig:
    """Validate a gemma4_assistant config.json (refusing what transformers' own validation refuses)."""
    if not is_assistant_config(raw):
        raise ConfigError(f"{source}: model_type {raw.get('model_type')!r} is not a Gemma 4 assistant ({MODEL_TYPE})")
    text = dict(raw.get("text_config") or {})
    if not text:
        raise ConfigError(f"{source}: a Gemma 4 assistant config needs its text_config")
    layers = text.get("num_hidden_layers")
    if text.get("enable_moe_block"):
        raise ConfigError(f"{source}: an assistant with MoE layers is not a Gemma 4 assistant")
    if text.get("num_kv_shared_layers") not in (None, 0, layers):
        raise ConfigError(
            f"{source}: every assistant layer must reuse the target's K/V "
            f"(num_kv_shared_layers {text.get('num_kv_shared_layers')} of {layers})"
        )
    # the layers' own K/V projections do not exist: parse the geometry as for a target
    cfg = parse_config(dict(text, num_kv_shared_layers=0, tie_word_embeddings=True), source)
    ordered = bool(raw.get("use_ordered_embeddings", False))
    centroids = int(raw.get("num_centroids", 2048))
    top_k = int(raw.get("centroid_intermediate_top_k", 32))
    if ordered and (centroids < 1 or cfg.vocab_size % centroids or not 0 < top_k <= centroids):
        raise ConfigError(
            f"{source}: {centroids} centroids with top {top_k} do not split a vocabulary of {cfg.vocab_size}"
        )
    return AssistantConfig(cfg, int(raw.get("backbone_hidden_size", 1536)), ordered, centroids, top_k)


def load_assistant_config(folder: str | Path) -> AssistantConfig:
    path = Path(folder) / "config.json"
    return parse_assistant_config(read_json(path, "assistant config"), str(path))


def check_assistant_pair(target: Gemma4Config, cfg: AssistantConfig, where: str) -> None:
    """Refuse an assistant made for a target of another shape: its width, vocabulary, and for each
    layer kind the head geometry of the target's K/V it attends over."""
    a = cfg.text
    if cfg.backbone_hidden_size != target.hidden_size or a.vocab_size != target.vocab_size:
        raise ConfigError(
            f"{where} is for a target of width {cfg.backbone_hidden_size} and {a.vocab_size} tokens; "
            f"this target has {target.hidden_size} and {target.vocab_size}"
        )
    for kind in {layer.kind for layer in a.layers}:
        mine = next(layer for layer in a.layers if layer.kind == kind)
        theirs = [layer for layer in target.layers if layer.kind == kind]
        if not theirs or (theirs[-1].num_kv_heads, theirs[-1].head_dim) != (mine.num_kv_heads, mine.head_dim):
            raise ConfigError(f"{where}: its {kind} layers attend over K/V the target's {kind} layers do not hold")


def assistant_expected_shapes(cfg: AssistantConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of an assistant checkpoint (names without the `model.` prefix) -> its shape
    (`masked_embedding.token_ordering` holds integers)."""
    text, d = cfg.text, cfg.text.hidden_size
    shapes: dict = {
        "embed_tokens.weight": (text.vocab_size, d),
        "norm.weight": (d,),
        "pre_projection.weight": (d, 2 * cfg.backbone_hidden_size),
        "post_projection.weight": (cfg.backbone_hidden_size, d),
    }
    for i, layer in enumerate(text.layers):
        p = f"layers.{i}."
        for norm in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            shapes[p + norm + ".weight"] = (d,)
        shapes[p + "self_attn.q_proj.weight"] = (text.num_heads * layer.head_dim, d)
        shapes[p + "self_attn.q_norm.weight"] = (layer.head_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (d, text.num_heads * layer.head_dim)
        shapes[p + "mlp.gate_proj.weight"] = (text.intermediate_size, d)
        shapes[p + "mlp.up_proj.weight"] = (text.intermediate_size, d)
        shapes[p + "mlp.down_proj.weight"] = (d, text.intermediate_size)
        shapes[p + "layer_scalar"] = (1,)
    if cfg.use_ordered_embeddings:
        shapes["masked_embedding.centroids.weight"] = (cfg.num_centroids, d)
        shapes["masked_embedding.token_ordering"] = (text.vocab_size,)
    return shapes


class Assistant:
    """The assistant's weights and its one draft step."""

    def __init__(self, cfg: AssistantConfig, weights: dict[str, torch.Tensor], device, dtype: torch.dtype):
        """Takes ownership of `weights` and empties it."""
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        w = weights
        self.embed = w.pop("embed_tokens.weight")  # the tied head
        self.final_norm = w.pop("norm.weight").float()
        self.pre_projection = w.pop("pre_projection.weight")
        self.post_projection = w.pop("post_projection.weight")
        self.layers = []
        for i, spec in enumerate(cfg.text.layers):
            p = f"layers.{i}."
            norms = {
                name: w.pop(p + name + ".weight").float()
                for name in (
                    "input_layernorm",
                    "post_attention_layernorm",
                    "pre_feedforward_layernorm",
                    "post_feedforward_layernorm",
                    "self_attn.q_norm",
                )
            }
            self.layers.append(
                {
                    "spec": spec,
                    "norms": norms,
                    "q": w.pop(p + "self_attn.q_proj.weight"),
                    "o": w.pop(p + "self_attn.o_proj.weight"),
                    "gate_up": concat_rows([w.pop(p + "mlp.gate_proj.weight"), w.pop(p + "mlp.up_proj.weight")]),
                    "down": w.pop(p + "mlp.down_proj.weight"),
                    "scalar": w.pop(p + "layer_scalar"),
                }
            )
        self.centroids = w.pop("masked_embedding.centroids.weight", None)
        ordering = w.pop("masked_embedding.token_ordering", None)
        self.token_ordering = None if ordering is None else ordering.long().view(cfg.num_centroids, -1)
        if w:
            raise ValueError(f"unused assistant weights: {sorted(w)[:5]}")
        self.inv_freq = {kind: spec.inv_freq().repeat(2).to(self.device) for kind, spec in cfg.text.rope.items()}

    def _rope(self, kind: str, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [1, head_dim] at `position` (fp32 angles, rounded once, as the target's)."""
        angles = position.view(1, 1) * self.inv_freq[kind]
        return torch.cos(angles).to(self.dtype), torch.sin(angles).to(self.dtype)

    def keys_seen(self, kind: str) -> int | None:
        """How many of the target's keys given to a layer of `kind` it attends: a sliding layer the
        last window + 1 (transformers' bidirectional window mask, flipped to look back), a full
        layer every one (None)."""
        window = self.cfg.text.sliding_window
        return window + 1 if kind == SLIDING and window is not None else None

    @torch.inference_mode()
    def step(self, token_embedding: torch.Tensor, hidden: torch.Tensor, attend, position) -> tuple:
        """One draft step: token_embedding and hidden [1, backbone] (the target's scaled embedding of
        the last token, and a hidden state of the target's width), attend(kind, q [1, heads, dim])
        -> [1, heads, dim] (attention at scale 1 over the target's K/V of its last layer of that
        kind, the last `keys_seen(kind)` of them: `attend_over`, or the cache in place), the query's
        position (an int, or a one-element device tensor: no copy that waits for the device) ->
        (logits [1, vocab] fp32, next hidden [1, backbone])."""
        cfg, eps = self.cfg.text, self.cfg.text.rms_norm_eps
        position = torch.as_tensor(position, device=self.device)
        h = linear(torch.cat([token_embedding, hidden], dim=-1).to(self.dtype), self.pre_projection)
        ropes = {kind: self._rope(kind, position) for kind in self.inv_freq}
        for layer in self.layers:
            spec, n = layer["spec"], layer["norms"]
            x = rms_norm(h, n["input_layernorm"], eps)
            q = linear(x, layer["q"]).view(1, cfg.num_heads, spec.head_dim)
            q = apply_rope(rms_norm(q, n["self_attn.q_norm"], eps), *ropes[spec.kind])
            a = attend(spec.kind, q)
            h = h + rms_norm(linear(a.reshape(1, -1), layer["o"]), n["post_attention_layernorm"], eps)
            x = rms_norm(h, n["pre_feedforward_layernorm"], eps)
            m = linear(glu_linear(x, layer["gate_up"], "gelu_tanh"), layer["down"])
            h = (h + rms_norm(m, n["post_feedforward_layernorm"], eps)) * layer["scalar"]
        h = rms_norm(h, self.final_norm, eps)
        return self._logits(h), linear(h, self.post_projection)

    def attend_over(self, shared_kv: dict):
        """`step`'s attend over K/V tensors: shared_kv {kind: (k, v)} each [positions, kv heads, head
        dim] in order, of which each layer sees the last `keys_seen`."""

        def attend(kind: str, q: torch.Tensor) -> torch.Tensor:
            k, v = shared_kv[kind]
            keep = self.keys_seen(kind)
            if keep is not None:
                k, v = k[-keep:], v[-keep:]
            return attend_all(q, k.to(q.dtype), v.to(q.dtype))

        return attend

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """[1, vocab] fp32: the tied head, or with ordered embeddings only the top centroids' tokens."""
        if self.token_ordering is None:
            return linear(h, self.embed).float()
        top = torch.topk(linear(h, self.centroids), self.cfg.centroid_top_k, dim=-1).indices[0]
        tokens = self.token_ordering[top].reshape(-1)  # the canonical ids of those centroids' tokens
        picked = F.linear(h, self.embed[tokens])
        logits = torch.full((1, self.cfg.text.vocab_size), 0.0, dtype=h.dtype, device=h.device)
        logits.fill_(picked.min() - 1.0)
        return logits.scatter_(1, tokens.view(1, -1), picked).float()


def attend_all(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query row q [1, Hq, D] over every key k, v [N, Hkv, D], at scale 1 (Gemma 4's)."""
    seen = torch.zeros(k.shape[0], dtype=torch.long, device=q.device)
    return attention(q, k, v, seen[:1], seen, None, 1.0, causal=False)


def is_assistant_folder(folder: str | Path) -> bool:
    """Whether a checkpoint folder holds a Gemma 4 assistant (by its config.json), not a DFlash drafter."""
    return is_assistant_config(read_json(Path(folder) / "config.json", "draft model config"))
