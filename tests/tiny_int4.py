"""Tiny int4 checkpoints in compressed-tensors `pack-quantized` format, packed by compressed-tensors itself.

Like cyankiwi/gemma-4-26B-A4B-it-AWQ-4bit (docs/model.md, the 4-bit checkpoint): linear and expert weights as
`weight_packed` int32 + `weight_scale` bf16 (+ `weight_zero_point` when asymmetric) + `weight_shape`;
the embedding and the routers in 16 bits; one dense MLP left in bf16 and listed in `ignore`; the
experts either fused 3-D (`experts.gate_up_proj_packed`) or per expert
(`experts.{e}.gate_proj.weight_packed`). The returned transformers model runs the same weights,
dequantized by compressed-tensors, as the independent reference.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from tiny_checkpoints import build_reference, write_checkpoint

GROUP = 8
IGNORED_MLP = r"re:.*layers\.0\.mlp\..*"  # the dense MLP of layer 0 stays in bf16


def _scheme(symmetric: bool, group: int | None = GROUP):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    strategy = dict(strategy="group", group_size=group) if group else dict(strategy="channel")
    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, **strategy)
    return QuantizationScheme(targets=["Linear"], weights=args)


def weights_json(symmetric: bool, group: int | None) -> dict:
    """A config group's `weights` as compressed-tensors writes it."""
    strategy = {"strategy": "group", "group_size": group} if group else {"strategy": "channel", "group_size": None}
    return {"num_bits": 4, "type": "int", "symmetric": symmetric, "dynamic": False, "observer": "minmax", **strategy}


def ct_quantize(weight: torch.Tensor, symmetric: bool, group: int | None = GROUP) -> tuple[dict, torch.Tensor]:
    """compressed-tensors' own qparams, packing and unpacking: (packed tensors, dequantized weight);
    group None: one group per row (the channel strategy)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = _scheme(symmetric, group)
    groups = weight.view(*weight.shape[:-1], -1, group or weight.shape[-1])
    scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
    state = {"weight": weight, "weight_scale": scale.to(torch.bfloat16)}
    if not symmetric:
        state["weight_zero_point"] = zero
    packed = PackedQuantizationCompressor.compress(state, scheme)
    # dequantize with the (exactly representable) bf16 scales widened to fp32, as our fp32 run does
    restored = PackedQuantizationCompressor.decompress(
        dict(packed, weight_scale=packed["weight_scale"].float()), scheme
    )["weight"]
    return packed, restored


@dataclass(frozen=True)
class Recipe:
    """How an export quantized the model: `scheme(tensor name)` gives (group or None for channel,
    symmetric) or None for a module left in 16 bits; `config_groups` and `ignore` are what its
    config.json says about that, in whatever form that export chose."""

    name: str
    scheme: Callable[[str], tuple[int | None, bool] | None]
    config_groups: dict
    ignore: list = field(default_factory=list)
    weight_shape: bool = True  # the optional `weight_shape` tensors


def default_recipe(symmetric: bool) -> Recipe:
    """One group, targets ["Linear"], group 8; layer 0's dense MLP left in bf16 by an `ignore` pattern."""
    return Recipe(
        "linear",
        lambda name: (GROUP, symmetric) if _quantized(name) else None,
        {"group_0": {"targets": ["Linear"], "weights": weights_json(symmetric, GROUP)}},
        ["lm_head", "re:.*embed_tokens.*", "re:.*router.*", "re:.*vision.*", IGNORED_MLP],
    )


def write_int4_checkpoint(
    folder: Path,
    layout: str = "conditional",
    experts: str = "fused",
    symmetric: bool = True,
    seed: int = 0,
    recipe: Recipe | None = None,
):
    """Write the checkpoint; return the transformers model holding the dequantized weights."""
    folder = Path(folder)
    recipe = recipe or default_recipe(symmetric)
    write_checkpoint(folder, layout, seed=seed)  # config, tokenizer, and the exact tensor names
    tensors = load_file(str(folder / "model.safetensors"))
    dequantized = {}
    for name in list(tensors):
        scheme = recipe.scheme(name) if _quantizable(name) else None
        if scheme is None:
            continue
        group, sym = scheme
        weight = tensors.pop(name)
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            packed, restored = ct_quantize(weight, sym, group)
            if experts == "fused":
                for key, value in packed.items():
                    tensors[name + "_" + key.removeprefix("weight_")] = value
            else:
                _per_expert(tensors, name, weight, sym, group)
        else:
            packed, restored = ct_quantize(weight, sym, group)
            for key, value in packed.items():
                tensors[name.removesuffix("weight") + key] = value
        dequantized[name] = restored
    if not recipe.weight_shape:
        tensors = {name: t for name, t in tensors.items() if not name.endswith("_shape")}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": recipe.config_groups,
        "ignore": recipe.ignore,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    reference = build_reference(layout, seed)
    own = reference.state_dict()
    for name, restored in dequantized.items():
        own[name] = restored.to(own[name].dtype)  # the file's names are the module's own
    reference.load_state_dict(own)
    return reference


def _quantizable(name: str) -> bool:
    """A linear or expert weight of the text model (what any recipe may quantize)."""
    if "vision" in name or "embed" in name or "router" in name or "norm" in name or "layer_scalar" in name:
        return False
    return name.endswith("_proj.weight") or name.endswith(("experts.gate_up_proj", "experts.down_proj"))


def _quantized(name: str) -> bool:
    return _quantizable(name) and not re.match(IGNORED_MLP[3:], name)


def _per_expert(tensors: dict, name: str, weight: torch.Tensor, symmetric: bool, group: int | None = GROUP) -> None:
    """The per-expert 2-D layout: experts.{e}.{gate,up,down}_proj.weight_*, each packed on its own."""
    base = name.rsplit("experts.", 1)[0] + "experts."
    parts = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
    for e in range(weight.shape[0]):
        for part, rows in zip(parts, weight[e].chunk(len(parts))):
            packed, _ = ct_quantize(rows.contiguous(), symmetric, group)
            for key, value in packed.items():
                tensors[f"{base}{e}.{part}.{key}"] = value
