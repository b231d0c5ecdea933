"""The exact Gemma 4 26B-A4B and z-lab DFlash drafter shapes with random weights, made on the device.

No checkpoint and no download (the GPU machines reach no model hub): the real configs (docs/model.md)
are filled with random weights laid out like the real 4-bit checkpoint, int4 group-32 symmetric
where it is int4 (every attention and MLP linear and the experts), 16-bit where it is not (tied
embedding / head, routers, norms, scalars). `layers` keeps the first N decoder layers (the last
kept one is full attention, as the config parser makes it), with the drafter's target_layer_ids
remapped into range. Used by `bench --synthetic`, gpu_check and the tests that record or count what
the real shapes launch.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

REAL_LAYERS = 30
LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 5
REAL_TARGET = {  # google/gemma-4-26B-A4B-it text config (docs/model.md)
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": 262144,
    "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": REAL_LAYERS, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
    "attention_k_eq_v": True, "attention_bias": False, "sliding_window": 1024, "layer_types": LAYER_TYPES,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}},
    "enable_moe_block": True, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
    "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": 30.0, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "eos_token_id": [1, 106], "bos_token_id": 2, "pad_token_id": 0,
    "dtype": "bfloat16"}
REAL_DRAFTER = {  # z-lab/gemma-4-26B-A4B-it-DFlash config.json (docs/model.md)
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 2816, "num_hidden_layers": 5,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 5632,
    "hidden_act": "silu", "attention_bias": False,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "sliding_window": 2048,
    "use_sliding_window": True, "max_window_layers": 5, "rope_theta": 1000000, "rope_scaling": None,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "vocab_size": 262144, "tie_word_embeddings": False,
    "block_size": 16, "num_target_layers": REAL_LAYERS, "final_logit_softcapping": 30.0, "bos_token_id": 2,
    "eos_token_id": 1, "pad_token_id": 0, "dtype": "bfloat16", "use_cache": True,
    "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 6, 11, 17, 22, 27]}}

GROUP = 32


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
    if not 1 <= layers <= REAL_LAYERS:
        raise ValueError(f"--layers must be 1..{REAL_LAYERS}, got {layers}")
    types = list(LAYER_TYPES[:layers])
    if "full_attention" not in types:
        types[-1] = "full_attention"  # at least one full layer (parse_config forces the last one anyway)
    return dict(REAL_TARGET, num_hidden_layers=layers, layer_types=types)


def draft_raw(layers: int = REAL_LAYERS) -> dict:
    ids = remap_layer_ids(REAL_DRAFTER["dflash_config"]["target_layer_ids"], layers)
    return dict(REAL_DRAFTER, num_target_layers=layers,
                dflash_config=dict(REAL_DRAFTER["dflash_config"], target_layer_ids=ids))


# --- random weights on the device -----------------------------------------------------------------

def _generator(device, seed: int):
    device = torch.device(device)
    return None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)


def random_int4(shape, device, dtype, gen) -> "Int4Weight":
    """Uniform nibbles (q in -8..7), scale 1/sqrt(fan_in)/4: outputs of about the inputs' size."""
    from flashdesk.kernels.int4 import Int4Weight

    *lead, fan_in = shape
    packed = torch.randint(-2**31, 2**31, (*lead, fan_in // 8), dtype=torch.int32, device=device, generator=gen)
    scale = torch.full((*lead, fan_in // GROUP), 0.25 / math.sqrt(fan_in), dtype=dtype, device=device)
    return Int4Weight(packed, scale, None, GROUP)


def _randn(shape, std, device, dtype, gen, mean=0.0):
    """Normal values written straight into the one tensor (no fp32 temporary, no second copy)."""
    return torch.empty(shape, dtype=dtype, device=device).normal_(mean, std, generator=gen)


def random_target_weights(cfg, device, dtype, seed: int = 0) -> dict:
    """Every tensor the model pops (weights.expected_shapes): int4 linears/experts, 16-bit the rest.
    On the "meta" device nothing is allocated (byte counting of the full model in tests)."""
    from flashdesk.engine.loading.weights import expected_shapes

    gen = _generator(device, seed)
    weights = {}
    for name, shape in expected_shapes(cfg).items():
        if name == "embed_tokens.weight":  # tied head: logits of std ~1 on normalized states
            weights[name] = _randn(shape, 0.02, device, dtype, gen)
        elif name.endswith("router.proj.weight"):  # router logits of std ~1: routing well spread
            weights[name] = _randn(shape, 1.0, device, dtype, gen)
        elif name.endswith("layer_scalar"):
            weights[name] = torch.ones(shape, dtype=dtype, device=device)
        elif len(shape) == 1:  # norms, router scale, per-expert scale
            weights[name] = _randn(shape, 0.05, device, dtype, gen, mean=1.0)
        elif shape[-1] % GROUP == 0:  # attention and MLP linears, experts
            weights[name] = random_int4(shape, device, dtype, gen)
        else:
            weights[name] = _randn(shape, 1 / math.sqrt(shape[-1]), device, dtype, gen)
    return weights


def random_draft_weights(dcfg, device, dtype, seed: int = 1) -> dict:
    """The drafter as z-lab ships it: 16-bit linears (1/sqrt(fan_in)), norms ~1."""
    from flashdesk.engine.model.drafter import draft_expected_shapes

    gen = _generator(device, seed)
    return {name: (_randn(shape, 0.05, device, dtype, gen, mean=1.0) if len(shape) == 1 else
                   _randn(shape, 1 / math.sqrt(shape[-1]), device, dtype, gen))
            for name, shape in draft_expected_shapes(dcfg).items()}


def synthetic_target(layers: int, device, dtype, seed: int = 0, vocab_size: int | None = None):
    """Gemma 4 26B-A4B over its first `layers` layers, random weights (`vocab_size`: a smaller
    vocabulary, where the whole head is not needed)."""
    from flashdesk.engine.model.config import parse_config
    from flashdesk.engine.model.gemma4 import Gemma4

    vocab = {} if vocab_size is None else {"vocab_size": vocab_size}
    cfg = parse_config(dict(target_raw(layers), **vocab))
    device = torch.device(device)
    return Gemma4(cfg, random_target_weights(cfg, device, dtype, seed), device, dtype)


def synthetic_drafter(target, seed: int = 1, quantize: str | None = None):
    """The DFlash drafter for a synthetic target (its layers and vocabulary), random weights."""
    from flashdesk.engine.model.config import check_pair, parse_draft_config
    from flashdesk.engine.model.drafter import Drafter

    dcfg = parse_draft_config(dict(draft_raw(target.cfg.num_layers), vocab_size=target.cfg.vocab_size))
    check_pair(target.cfg, dcfg, "synthetic drafter")
    return Drafter(dcfg, random_draft_weights(dcfg, target.device, target.dtype, seed), target, quantize=quantize)


def synthetic_pair(layers: int, device, dtype, seed: int = 0, vocab_size: int | None = None,
                   quantize: str | None = None):
    """(target, drafter): synthetic_target and its synthetic_drafter (seeded seed + 1)."""
    target = synthetic_target(layers, device, dtype, seed, vocab_size)
    return target, synthetic_drafter(target, seed + 1, quantize)
