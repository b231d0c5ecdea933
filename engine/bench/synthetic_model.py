"""The exact Gemma 4 26B-A4B and z-lab DFlash drafter shapes with random weights, made on the device.

No checkpoint and no download (the GPU machines reach no model hub): the real configs
(engine/model/known_models.py) are filled with random weights laid out like the real 4-bit
checkpoint, int4 group-32 symmetric where it is int4 (every attention and MLP linear and the
experts), 16-bit where it is not (tied embedding / head, routers, norms, scalars). `layers` keeps
the first N decoder layers (the last kept one is full attention, as the config parser makes it),
with the drafter's target_layer_ids remapped into range. Used by `bench --synthetic`, gpu_check and
the tests that record or count what the real shapes launch.
"""

from __future__ import annotations

import math

import torch

from flashdesk.engine.model import known_models
from flashdesk.kernels.int4 import Int4Weight

GROUP = known_models.INT4_GROUP


# --- random weights on the device -----------------------------------------------------------------


def _generator(device, seed: int):
    device = torch.device(device)
    return None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)


def random_int4(shape, device, dtype, gen) -> Int4Weight:
    """Uniform nibbles (q in -8..7), scale 1/sqrt(fan_in)/4: outputs of about the inputs' size."""
    *lead, fan_in = shape
    packed = torch.randint(-(2**31), 2**31, (*lead, fan_in // 8), dtype=torch.int32, device=device, generator=gen)
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
    return {
        name: (
            _randn(shape, 0.05, device, dtype, gen, mean=1.0)
            if len(shape) == 1
            else _randn(shape, 1 / math.sqrt(shape[-1]), device, dtype, gen)
        )
        for name, shape in draft_expected_shapes(dcfg).items()
    }


def synthetic_target(layers: int, device, dtype, seed: int = 0, vocab_size: int | None = None):
    """Gemma 4 26B-A4B over its first `layers` layers, random weights (`vocab_size`: a smaller
    vocabulary, where the whole head is not needed)."""
    from flashdesk.engine.model.config import parse_config
    from flashdesk.engine.model.gemma4 import Gemma4

    vocab = {} if vocab_size is None else {"vocab_size": vocab_size}
    cfg = parse_config(dict(known_models.target_raw(layers), **vocab))
    device = torch.device(device)
    return Gemma4(cfg, random_target_weights(cfg, device, dtype, seed), device, dtype)


def synthetic_drafter(target, seed: int = 1, quantize: str | None = None):
    """The DFlash drafter for a synthetic target (its layers and vocabulary), random weights."""
    from flashdesk.engine.model.config import check_pair, parse_draft_config
    from flashdesk.engine.model.drafter import Drafter

    raw = known_models.draft_raw(target.cfg.num_layers)
    dcfg = parse_draft_config(dict(raw, vocab_size=target.cfg.vocab_size))
    check_pair(target.cfg, dcfg, "synthetic drafter")
    return Drafter(dcfg, random_draft_weights(dcfg, target.device, target.dtype, seed), target, quantize=quantize)


def synthetic_assistant(target, seed: int = 2, raw: dict | None = None):
    """Gemma 4's MTP assistant for a synthetic target (its vocabulary), random 16-bit weights:
    linears 1/sqrt(fan_in), norms and layer scalars ~1. `raw`: another assistant config than the
    real one (smaller shapes)."""
    from flashdesk.engine.model.assistant import Assistant, assistant_expected_shapes, parse_assistant_config

    raw = dict(raw or known_models.assistant_raw())
    raw["text_config"] = dict(raw["text_config"], vocab_size=target.cfg.vocab_size)
    cfg = parse_assistant_config(raw, "synthetic assistant")
    gen = _generator(target.device, seed)
    weights = {}
    for name, shape in assistant_expected_shapes(cfg).items():
        if name.endswith("token_ordering"):
            weights[name] = torch.randperm(shape[0], device=target.device)
        elif len(shape) == 1:
            weights[name] = _randn(shape, 0.05, target.device, target.dtype, gen, mean=1.0)
        else:
            weights[name] = _randn(shape, 1 / math.sqrt(shape[-1]), target.device, target.dtype, gen)
    return Assistant(cfg, weights, target.device, target.dtype)


def synthetic_pair(
    layers: int, device, dtype, seed: int = 0, vocab_size: int | None = None, quantize: str | None = None
):
    """(target, drafter): synthetic_target and its synthetic_drafter (seeded seed + 1)."""
    target = synthetic_target(layers, device, dtype, seed, vocab_size)
    return target, synthetic_drafter(target, seed + 1, quantize)
