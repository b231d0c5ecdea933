"""The models FlashDesk is built for, as data: Gemma 4 26B-A4B's text config and z-lab's DFlash
drafter for it, exactly as their config.json files give them (docs/model.md has the sources).

One table for every place that needs the real shapes without the checkpoints (which no build
machine has): the synthetic bench and gpu_check build random weights from it, the setup page's
recommendation plans memory with it, and the tests check the kernels' compile specs against it.
`shapes()` swaps in smaller configs for tests and CPU smoke runs; read the configs through this
module's attributes or functions (not `from ... import REAL_TARGET`) so that a swap is seen.
"""

from __future__ import annotations

from contextlib import contextmanager

REAL_LAYERS = 30
LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 5
REAL_TARGET = {  # google/gemma-4-26B-A4B-it text config
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
REAL_DRAFTER = {  # z-lab/gemma-4-26B-A4B-it-DFlash config.json
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
INT4_GROUP = 32  # the 4-bit export's group size (symmetric)


@contextmanager
def shapes(target: dict, drafter: dict):
    """Run with other (smaller) raw configs in place of the real ones: tests and CPU smoke runs."""
    global REAL_TARGET, REAL_DRAFTER
    saved = REAL_TARGET, REAL_DRAFTER
    REAL_TARGET, REAL_DRAFTER = target, drafter
    try:
        yield
    finally:
        REAL_TARGET, REAL_DRAFTER = saved


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
