"""The models FlashDesk is built for, as data: Gemma 4 26B-A4B's text config, z-lab's DFlash
drafter for it and Google's MTP assistant for it, as their config.json files give them (the fields
the engine reads; docs/model.md has the sources).

One table for every place that needs the real shapes without the checkpoints (which no build
machine has): the synthetic bench and gpu_check build random weights from it, the setup page's
recommendation plans memory with it, and the tests check the kernels' compile specs against it.
`shapes()` swaps in smaller configs for tests and CPU smoke runs; read the configs through this
module's attributes or functions (not `from ... import REAL_TARGET`) so that a swap is seen.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

REAL_LAYERS = 30
LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 5
REAL_TARGET: dict[str, Any] = {  # google/gemma-4-26B-A4B-it text config
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "vocab_size": 262144,
    "hidden_size": 2816,
    "intermediate_size": 2112,
    "num_hidden_layers": REAL_LAYERS,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_global_key_value_heads": 2,
    "attention_k_eq_v": True,
    "attention_bias": False,
    "sliding_window": 1024,
    "layer_types": LAYER_TYPES,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    "enable_moe_block": True,
    "num_experts": 128,
    "top_k_experts": 8,
    "moe_intermediate_size": 704,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "eos_token_id": [1, 106],
    "bos_token_id": 2,
    "pad_token_id": 0,
    "dtype": "bfloat16",
}
REAL_DRAFTER: dict[str, Any] = {  # z-lab/gemma-4-26B-A4B-it-DFlash config.json
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 2816,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 5632,
    "hidden_act": "silu",
    "attention_bias": False,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 2048,
    "use_sliding_window": True,
    "max_window_layers": 5,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "vocab_size": 262144,
    "tie_word_embeddings": False,
    "block_size": 16,
    "num_target_layers": REAL_LAYERS,
    "final_logit_softcapping": 30.0,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "dtype": "bfloat16",
    "use_cache": True,
    "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 6, 11, 17, 22, 27]},
}
# google/gemma-4-26B-A4B-it-assistant config.json, the fields the engine reads (the multimodal token
# ids it copies from the target and transformers' bookkeeping left out). The checkpoint itself has
# never been read on the machines FlashDesk is built on; the values come from public write-ups of
# its config.json (docs/model.md, "The MTP assistant", has the sources and how they agree): a
# four-layer dense Gemma 4 of width 1024 whose layers attend over the target's K/V (so its KV
# geometry is the target's), and the full tied head (no ordered embeddings). Its bf16 weights come
# to 0.84 GB by these shapes, the size of the published bf16 copies. Defaults of transformers'
# Gemma4AssistantConfig: num_centroids 2048 and centroid_intermediate_top_k 32 (unused without
# ordered embeddings).
REAL_ASSISTANT: dict[str, Any] = {
    "architectures": ["Gemma4AssistantForCausalLM"],
    "model_type": "gemma4_assistant",
    "backbone_hidden_size": 2816,  # the target's hidden size
    "use_ordered_embeddings": False,
    "num_centroids": 2048,
    "centroid_intermediate_top_k": 32,
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma4_text",
        "vocab_size": 262144,
        "hidden_size": 1024,
        "intermediate_size": 8192,
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "num_global_key_value_heads": 2,
        "head_dim": 256,
        "global_head_dim": 512,
        "attention_k_eq_v": True,
        "attention_bias": False,
        "sliding_window": 1024,
        "rope_parameters": REAL_TARGET["rope_parameters"],
        "num_kv_shared_layers": 4,  # every layer reads the target's K/V
        "enable_moe_block": False,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0,
        "use_double_wide_mlp": False,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": None,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
    },
}
INT4_GROUP = 32  # the 4-bit export's group size (symmetric)


@contextmanager
def shapes(target: dict, drafter: dict, assistant: dict | None = None):
    """Run with other (smaller) raw configs in place of the real ones: tests and CPU smoke runs
    (the assistant's only when one is given)."""
    global REAL_TARGET, REAL_DRAFTER, REAL_ASSISTANT
    saved = REAL_TARGET, REAL_DRAFTER, REAL_ASSISTANT
    REAL_TARGET, REAL_DRAFTER = target, drafter
    if assistant is not None:
        REAL_ASSISTANT = assistant
    try:
        yield
    finally:
        REAL_TARGET, REAL_DRAFTER, REAL_ASSISTANT = saved


def remap_layer_ids(ids, num_layers: int, real_layers: int = REAL_LAYERS) -> list[int]:
    """The drafter's tapped layers scaled from the real 30 onto the first num_layers (in range)."""
    if num_layers >= real_layers:
        return [min(i, num_layers - 1) for i in ids]
    return [min(num_layers - 1, round(i * (num_layers - 1) / (real_layers - 1))) for i in ids]


def target_raw(layers: int = REAL_LAYERS) -> dict:
    """The target's config over its first `layers` layers (the last kept one full attention)."""
    if not 1 <= layers <= REAL_LAYERS:
        raise ValueError(f"--layers must be 1..{REAL_LAYERS}, got {layers}")
    types = list(LAYER_TYPES[:layers])
    if "full_attention" not in types:
        types[-1] = "full_attention"  # at least one full layer (parse_config forces the last one anyway)
    return dict(REAL_TARGET, num_hidden_layers=layers, layer_types=types)


def draft_raw(layers: int = REAL_LAYERS) -> dict:
    """The drafter's config for a target of `layers` layers (its tapped layers remapped into range)."""
    ids = remap_layer_ids(REAL_DRAFTER["dflash_config"]["target_layer_ids"], layers)
    return dict(
        REAL_DRAFTER, num_target_layers=layers, dflash_config=dict(REAL_DRAFTER["dflash_config"], target_layer_ids=ids)
    )


def assistant_raw() -> dict:
    """The MTP assistant's config (a copy: the table stays as it is)."""
    return dict(REAL_ASSISTANT, text_config=dict(REAL_ASSISTANT["text_config"]))
