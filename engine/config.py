"""Parse a Gemma 4 `config.json` into small frozen dataclasses, refusing what we do not implement.

Accepted: `Gemma4ForConditionalGeneration` (text config nested under `text_config`; the vision and
audio towers are ignored) and `Gemma4ForCausalLM` / a bare `gemma4_text` config. Field meanings and
defaults follow transformers' `Gemma4TextConfig` (MODEL-SPEC.md section 1 and 2).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from flashdesk.engine.errors import ConfigError

SLIDING = "sliding_attention"
FULL = "full_attention"
SUPPORTED_ACTIVATIONS = ("gelu_pytorch_tanh",)
SUPPORTED_ROPE_TYPES = ("default", "proportional")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding of one layer type: `rotated_pairs` of the head_dim/2 pairs turn, the rest pass."""

    theta: float
    head_dim: int
    rotated_pairs: int

    def inv_freq(self):
        import torch

        exponents = torch.arange(0, 2 * self.rotated_pairs, 2, dtype=torch.float32) / self.head_dim
        rotated = 1.0 / (self.theta**exponents)
        still = torch.zeros(self.head_dim // 2 - self.rotated_pairs, dtype=torch.float32)
        return torch.cat([rotated, still])


@dataclass(frozen=True)
class LayerSpec:
    """Attention geometry of one decoder layer."""

    kind: str  # SLIDING or FULL
    head_dim: int
    num_kv_heads: int
    k_eq_v: bool  # values come from the raw k_proj output (no v_proj)

    @property
    def sliding(self) -> bool:
        return self.kind == SLIDING


@dataclass(frozen=True)
class Gemma4Config:
    """Everything the text model needs, already validated."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    layers: tuple[LayerSpec, ...]
    rope: dict  # layer kind -> RopeSpec
    sliding_window: int
    rms_norm_eps: float
    final_logit_softcapping: float | None
    max_position_embeddings: int
    enable_moe: bool
    num_experts: int
    top_k_experts: int
    moe_intermediate_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    architecture: str
    dtype: str

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden_size)


def read_json(path: Path, what: str) -> dict:
    """Read a JSON file with an error that names the file and what it should have been."""
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{what} is not valid JSON: {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{what} must hold a JSON object: {path}")
    return data


def load_config(model_dir: str | Path) -> Gemma4Config:
    """Load and validate `<model_dir>/config.json` of a Gemma 4 target."""
    path = Path(model_dir) / "config.json"
    return parse_config(read_json(path, "model config"), source=str(path))


def _eos_ids(*candidates) -> tuple[int, ...]:
    for value in candidates:
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        return tuple(int(i) for i in ids)
    return ()


def parse_config(raw: dict, source: str = "config.json") -> Gemma4Config:
    """Turn a raw config dict into a Gemma4Config, or raise ConfigError naming the problem."""
    arch = (raw.get("architectures") or [None])[0]
    if "text_config" in raw and raw["text_config"] is not None:
        text = raw["text_config"]
        arch = arch or "Gemma4ForConditionalGeneration"
    else:
        text = raw
        arch = arch or "Gemma4ForCausalLM"
    if arch not in ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"):
        raise ConfigError(f"{source}: architecture {arch!r} is not a Gemma 4 target "
                          "(expected Gemma4ForConditionalGeneration or Gemma4ForCausalLM)")
    if text.get("model_type", "gemma4_text") not in ("gemma4_text", "gemma4"):
        raise ConfigError(f"{source}: model_type {text.get('model_type')!r} is not gemma4_text")

    def need(key):
        if key not in text or text[key] is None:
            raise ConfigError(f"{source}: required field {key!r} is missing from the text config")
        return text[key]

    def refuse(feature, detail):
        raise ConfigError(f"{source}: {feature} is not supported by FlashDesk ({detail})")

    if text.get("hidden_size_per_layer_input"):
        refuse("per-layer inputs (PLE)", f"hidden_size_per_layer_input={text['hidden_size_per_layer_input']}")
    if text.get("num_kv_shared_layers"):
        refuse("KV sharing", f"num_kv_shared_layers={text['num_kv_shared_layers']}")
    if text.get("use_bidirectional_attention") == "all":
        refuse("bidirectional text attention", "use_bidirectional_attention='all'")
    if text.get("attention_bias"):
        refuse("attention bias", "attention_bias=true")
    activation = text.get("hidden_activation", "gelu_pytorch_tanh")
    if activation not in SUPPORTED_ACTIVATIONS:
        refuse(f"activation {activation!r}", f"supported: {', '.join(SUPPORTED_ACTIVATIONS)}")

    num_layers = int(need("num_hidden_layers"))
    hidden = int(need("hidden_size"))
    num_heads = int(need("num_attention_heads"))
    layer_types = text.get("layer_types") or [
        SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)
    ]
    layer_types = list(layer_types)
    if len(layer_types) != num_layers:
        raise ConfigError(f"{source}: layer_types has {len(layer_types)} entries for {num_layers} layers")
    unknown = sorted(set(layer_types) - {SLIDING, FULL})
    if unknown:
        refuse(f"layer type {unknown[0]!r}", f"known: {SLIDING}, {FULL}")
    layer_types[-1] = FULL  # transformers forces the last layer to full attention; so do we

    k_eq_v = bool(text.get("attention_k_eq_v", False))
    head_dim = int(text.get("head_dim") or hidden // num_heads)
    kv_heads = int(need("num_key_value_heads"))
    full_overrides = {"head_dim": int(text.get("global_head_dim", 512))}
    if k_eq_v and text.get("num_global_key_value_heads") is not None:
        full_overrides["num_key_value_heads"] = int(text["num_global_key_value_heads"])
    per_layer = text.get("per_layer_config")
    layers = []
    for i, kind in enumerate(layer_types):
        spec = {"head_dim": head_dim, "num_key_value_heads": kv_heads}
        if per_layer is not None:  # a config saved by transformers: explicit per-layer overrides
            spec.update(per_layer.get(str(i), per_layer.get(i, per_layer.get(kind, {}))) or {})
        elif kind == FULL:
            spec.update(full_overrides)
        layer_kv = int(spec["num_key_value_heads"])
        if num_heads % layer_kv:
            raise ConfigError(f"{source}: layer {i}: {num_heads} attention heads are not a multiple "
                              f"of {layer_kv} key/value heads")
        layers.append(LayerSpec(kind, int(spec["head_dim"]), layer_kv, k_eq_v and kind == FULL))

    rope_params = text.get("rope_parameters") or {
        SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
    }
    rope = {}
    for kind in sorted(set(layer_types)):
        params = rope_params.get(kind)
        if not isinstance(params, dict):
            raise ConfigError(f"{source}: rope_parameters has no entry for {kind}")
        rope_type = params.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            refuse(f"rope_type {rope_type!r}", f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        if params.get("factor", 1.0) != 1.0:
            refuse("scaled RoPE", f"factor={params['factor']}")
        dim = next(spec.head_dim for spec in layers if spec.kind == kind)
        pairs = dim // 2
        if rope_type == "proportional":
            pairs = int(float(params.get("partial_rotary_factor", 1.0)) * dim // 2)
        rope[kind] = RopeSpec(float(params["rope_theta"]), dim, pairs)
    for i, spec in enumerate(layers):
        if spec.head_dim != rope[spec.kind].head_dim:
            refuse("mixed head dims within one layer type", f"layer {i} has head_dim {spec.head_dim}")

    enable_moe = bool(text.get("enable_moe_block", False))
    if enable_moe:
        for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
            need(key)
        if int(text["top_k_experts"]) > int(text["num_experts"]):
            raise ConfigError(f"{source}: top_k_experts exceeds num_experts")
    if text.get("tie_word_embeddings", raw.get("tie_word_embeddings", True)) is False:
        refuse("an untied LM head", "tie_word_embeddings=false")

    softcap = text.get("final_logit_softcapping")
    return Gemma4Config(
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=num_layers,
        num_heads=num_heads,
        layers=tuple(layers),
        rope=rope,
        sliding_window=int(text.get("sliding_window") or 512),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        final_logit_softcapping=float(softcap) if softcap else None,
        max_position_embeddings=int(text.get("max_position_embeddings", 131_072)),
        enable_moe=enable_moe,
        num_experts=int(text.get("num_experts") or 0),
        top_k_experts=int(text.get("top_k_experts") or 0),
        moe_intermediate_size=int(text.get("moe_intermediate_size") or 0),
        eos_token_ids=_eos_ids(raw.get("eos_token_id"), text.get("eos_token_id")),
        bos_token_id=text.get("bos_token_id", 2),
        architecture=arch,
        dtype=str(text.get("dtype") or raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"),
    )
