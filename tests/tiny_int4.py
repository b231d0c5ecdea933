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
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tiny_checkpoints import build_reference, write_checkpoint

GROUP = 8
IGNORED_MLP = r"re:.*layers\.0\.mlp\..*"  # the dense MLP of layer 0 stays in bf16


def _scheme(symmetric: bool):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=GROUP)
    return QuantizationScheme(targets=["Linear"], weights=args)


def ct_quantize(weight: torch.Tensor, symmetric: bool) -> tuple[dict, torch.Tensor]:
    """compressed-tensors' own qparams, packing and unpacking: (packed tensors, dequantized weight)."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = _scheme(symmetric)
    groups = weight.view(*weight.shape[:-1], -1, GROUP)
    scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights)
    state = {"weight": weight, "weight_scale": scale.to(torch.bfloat16)}
    if not symmetric:
        state["weight_zero_point"] = zero
    packed = PackedQuantizationCompressor.compress(state, scheme)
    # dequantize with the (exactly representable) bf16 scales widened to fp32, as our fp32 run does
    restored = PackedQuantizationCompressor.decompress(dict(packed, weight_scale=packed["weight_scale"].float()),
                                                       scheme)["weight"]
    return packed, restored


def write_int4_checkpoint(folder: Path, layout: str = "conditional", experts: str = "fused",
                          symmetric: bool = True, seed: int = 0):
    """Write the checkpoint; return the transformers model holding the dequantized weights."""
    folder = Path(folder)
    write_checkpoint(folder, layout, seed=seed)  # config, tokenizer, and the exact tensor names
    tensors = load_file(str(folder / "model.safetensors"))
    dequantized = {}
    for name in list(tensors):
        if not _quantized(name):
            continue
        weight = tensors.pop(name)
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            packed, restored = ct_quantize(weight, symmetric)
            if experts == "fused":
                for key, value in packed.items():
                    tensors[name + "_" + key.removeprefix("weight_")] = value
            else:
                _per_expert(tensors, name, weight, symmetric)
        else:
            packed, restored = ct_quantize(weight, symmetric)
            for key, value in packed.items():
                tensors[name.removesuffix("weight") + key] = value
        dequantized[name] = restored
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": symmetric, "strategy": "group", "group_size": GROUP,
            "dynamic": False}}},
        "ignore": ["lm_head", "re:.*embed_tokens.*", "re:.*router.*", "re:.*vision.*", IGNORED_MLP],
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    reference = build_reference(layout, seed)
    own = reference.state_dict()
    for name, restored in dequantized.items():
        own[name] = restored.to(own[name].dtype)  # the file's names are the module's own
    reference.load_state_dict(own)
    return reference


def _quantized(name: str) -> bool:
    if "vision" in name or "embed" in name or "router" in name or "norm" in name or "layer_scalar" in name:
        return False
    if re.match(IGNORED_MLP[3:], name):
        return False
    return name.endswith("_proj.weight") or name.endswith(("experts.gate_up_proj", "experts.down_proj"))


def _per_expert(tensors: dict, name: str, weight: torch.Tensor, symmetric: bool) -> None:
    """The per-expert 2-D layout: experts.{e}.{gate,up,down}_proj.weight_*, each packed on its own."""
    base = name.rsplit("experts.", 1)[0] + "experts."
    parts = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
    for e in range(weight.shape[0]):
        for part, rows in zip(parts, weight[e].chunk(len(parts))):
            packed, _ = ct_quantize(rows.contiguous(), symmetric)
            for key, value in packed.items():
                tensors[f"{base}{e}.{part}.{key}"] = value
