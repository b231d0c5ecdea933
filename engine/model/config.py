"""Parse a Gemma 4 `config.json` into small frozen dataclasses, refusing what we do not implement.

Accepted: `Gemma4ForConditionalGeneration` (text config nested under `text_config`; the vision and
audio towers are ignored) and `Gemma4ForCausalLM` / a bare `gemma4_text` config. Field meanings and
defaults follow transformers' `Gemma4TextConfig` (docs/model.md).
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
        raise ConfigError(
            f"{source}: architecture {arch!r} is not a Gemma 4 target "
            "(expected Gemma4ForConditionalGeneration or Gemma4ForCausalLM)"
        )
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
    layer_types = text.get("layer_types") or [SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)]
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
        sizes = {"head_dim": head_dim, "num_key_value_heads": kv_heads}
        if per_layer is not None:  # a config saved by transformers: explicit per-layer overrides
            sizes.update(per_layer.get(str(i), per_layer.get(i, per_layer.get(kind, {}))) or {})
        elif kind == FULL:
            sizes.update(full_overrides)
        layer_kv = int(sizes["num_key_value_heads"])
        if num_heads % layer_kv:
            raise ConfigError(
                f"{source}: layer {i}: {num_heads} attention heads are not a multiple of {layer_kv} key/value heads"
            )
        layers.append(LayerSpec(kind, int(sizes["head_dim"]), layer_kv, k_eq_v and kind == FULL))

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


# --- the DFlash drafter ------------------------------------------------------------------------

DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_top_k")


@dataclass(frozen=True)
class DraftConfig:
    """z-lab's DFlash drafter (Qwen3-style layers reading the target's hidden states)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    layer_kinds: tuple[str, ...]
    causal: tuple[bool, ...]  # per layer: sliding layers are causal, full layers see the whole block
    sliding_window: int | None
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    vocab_size: int
    input_embedding_scale: float
    output_multiplier: float
    final_logit_softcapping: float | None


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule for spreading the tapped layers over the target when the config names none."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def load_draft_config(draft_dir: str | Path) -> DraftConfig:
    path = Path(draft_dir) / "config.json"
    return parse_draft_config(read_json(path, "drafter config"), source=str(path))


def parse_draft_config(raw: dict, source: str = "config.json") -> DraftConfig:
    """Validate a DFlash drafter config; DFlash2 and unknown architectures are refused by name."""
    dflash = raw.get("dflash_config") or {}

    def value(name, default=None):  # dflash_config first, then the top level, as z-lab reads it
        return dflash.get(name, raw.get(name, default))

    arch = (raw.get("architectures") or [None])[0]
    if any(value(name) is not None for name in DFLASH2_FIELDS) or arch == "DFlash2DraftModel":
        raise ConfigError(
            f"{source}: DFlash2 drafters (conv and selector fields) are not supported yet; use a DFlash (v1) drafter"
        )
    if arch == "Gemma4AssistantForCausalLM" or raw.get("model_type") == "gemma4_assistant":
        raise ConfigError(
            f"{source}: a Gemma 4 MTP assistant, not a DFlash drafter (as the draft model, `--draft` "
            "tells the two apart)"
        )
    if arch != "DFlashDraftModel":
        raise ConfigError(f"{source}: architecture {arch!r} is not a DFlash drafter (expected DFlashDraftModel)")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if raw.get(key) is None:
            raise ConfigError(f"{source}: required field {key!r} is missing from the drafter config")
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{source}: drafter activation {raw['hidden_act']!r} is not supported (only silu)")
    if raw.get("attention_bias"):
        raise ConfigError(f"{source}: drafter attention bias is not supported")
    if value("mask_token_id") is None:
        raise ConfigError(f"{source}: dflash_config.mask_token_id is missing")

    num_layers = int(raw["num_hidden_layers"])
    window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    kinds = raw.get("layer_types") or [
        SLIDING if window is not None and i >= int(raw.get("max_window_layers", num_layers)) else FULL
        for i in range(num_layers)
    ]
    if len(kinds) != num_layers or set(kinds) - {SLIDING, FULL}:
        raise ConfigError(f"{source}: layer_types must list {num_layers} of {SLIDING!r} / {FULL!r}")
    is_causal = value("is_causal")
    causal = tuple(kind == SLIDING if is_causal is None else bool(is_causal) for kind in kinds)

    rope = raw.get("rope_parameters") or {}
    theta = raw.get("rope_theta", rope.get("rope_theta"))
    if theta is None:
        raise ConfigError(f"{source}: no rope_theta (top level or under rope_parameters)")
    scaling = raw.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default" or scaling.get("rope_type", "default") != "default":
        raise ConfigError(f"{source}: scaled RoPE in the drafter is not supported")

    num_target_layers = int(value("num_target_layers", 0) or 0)
    layer_ids = value("target_layer_ids")
    if layer_ids is None:
        if not num_target_layers:
            raise ConfigError(f"{source}: neither target_layer_ids nor num_target_layers is given")
        layer_ids = default_target_layer_ids(num_target_layers, num_layers)
    softcap = value("final_logit_softcapping")
    heads = int(raw["num_attention_heads"])
    return DraftConfig(
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        layer_kinds=tuple(kinds),
        causal=causal,
        sliding_window=int(window) if window is not None else None,
        block_size=int(value("block_size", 16)),
        mask_token_id=int(value("mask_token_id")),
        target_layer_ids=tuple(int(i) for i in layer_ids),
        num_target_layers=num_target_layers,
        vocab_size=int(raw["vocab_size"]),
        input_embedding_scale=float(value("input_embedding_scale", 1.0)),
        output_multiplier=float(value("output_multiplier", 1.0)),
        final_logit_softcapping=float(softcap) if softcap else None,
    )


def check_pair(target: Gemma4Config, draft: DraftConfig, draft_source: str = "drafter") -> None:
    """Refuse a drafter that was not made for this target: the numbers that must agree, named."""
    problems = []
    if draft.hidden_size != target.hidden_size:
        problems.append(f"hidden size {draft.hidden_size} != target's {target.hidden_size}")
    if draft.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {draft.vocab_size} != target's {target.vocab_size}")
    if draft.num_target_layers and draft.num_target_layers != target.num_layers:
        problems.append(f"num_target_layers {draft.num_target_layers} != target's {target.num_layers} layers")
    bad = [i for i in draft.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        problems.append(
            f"target_layer_ids {list(draft.target_layer_ids)} name layer {bad[0]}, "
            f"but the target has layers 0..{target.num_layers - 1}"
        )
    if not 0 <= draft.mask_token_id < target.vocab_size:
        problems.append(f"mask_token_id {draft.mask_token_id} is outside the vocabulary")
    if draft.block_size < 2:
        problems.append(f"block_size {draft.block_size} leaves no room for a draft")
    if problems:
        raise ConfigError(f"{draft_source} does not match the target model: " + "; ".join(problems))
