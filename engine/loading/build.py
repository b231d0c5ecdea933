"""Build the target and the drafter from checkpoint folders: the loader's checks on every file's
header first (names, shapes, dtypes, the quantization scheme), then the weights streamed to the
device one tensor at a time. `model/` computes and never reads a file of weights; this is where a
folder becomes a model."""

from __future__ import annotations

from pathlib import Path

import torch

from flashdesk.engine.loading.quant import assemble, parse_quant_config, plan, quantize_on_load
from flashdesk.engine.loading.weights import TensorSpec, expected_shapes, load_tensors, scan_checkpoint, validate
from flashdesk.engine.model.assistant import (
    Assistant,
    AssistantConfig,
    assistant_expected_shapes,
    check_assistant_pair,
    is_assistant_folder,
    load_assistant_config,
)
from flashdesk.engine.model.config import DraftConfig, check_pair, load_config, load_draft_config, read_json
from flashdesk.engine.model.drafter import GROUP_SIZE, Drafter, check_draft_quantize, draft_expected_shapes
from flashdesk.engine.model.gemma4 import Gemma4


def load_target(
    model_dir: str | Path, device="cpu", dtype=torch.float32, quantize: str | None = None, progress=None
) -> Gemma4:
    """Load bf16 or int4 (compressed-tensors) weights; `quantize="int4"` packs bf16 ones while loading.
    `progress(done_bytes, total_bytes)` follows the bytes read."""
    cfg = load_config(model_dir)
    quant = parse_quant_config(read_json(Path(model_dir) / "config.json", "model config"))
    if quantize not in (None, "int4"):
        raise ValueError(f"unknown quantization {quantize!r}: the choice is int4")
    if quantize and quant is not None:
        raise ValueError(f"{model_dir} is already quantized; --quantize applies to bf16 checkpoints")
    entries = scan_checkpoint(model_dir)
    specs, packed = plan(expected_shapes(cfg), entries, quant)
    validate(entries, specs)
    transform = quantize_on_load() if quantize else None
    weights = assemble(load_tensors(entries, torch.device(device), dtype, transform, progress), packed)
    return Gemma4(cfg, weights, device, dtype)


def load_drafter(draft_dir: str | Path, target: Gemma4, progress=None, quantize: str | None = None) -> Drafter:
    """Load a DFlash drafter for `target` in its dtype, or with quantize="int4" packing each linear
    as it arrives (the bf16 drafter is never whole on the device)."""
    check_draft_quantize(quantize)
    cfg = load_draft_config(draft_dir)
    check_pair(target.cfg, cfg, f"drafter {draft_dir}")
    entries = scan_checkpoint(draft_dir)
    validate(entries, draft_expected_shapes(cfg), "DFlash drafter")
    transform = quantize_on_load(GROUP_SIZE) if quantize else None
    weights = load_tensors(entries, target.device, target.dtype, transform, progress)
    return Drafter(cfg, weights, target, quantize)


def load_assistant(folder: str | Path, target: Gemma4, progress=None) -> Assistant:
    """Load a Gemma 4 MTP assistant for `target`, in its dtype on its device, after checking that
    it was made for a target of this shape: its width, vocabulary, and for each layer kind the head
    geometry of the target's K/V it attends over."""
    cfg = load_assistant_config(folder)
    check_assistant_pair(target.cfg, cfg, f"assistant {folder}")
    expected = {
        name: TensorSpec(shape, "int") if name.endswith("token_ordering") else TensorSpec(shape)
        for name, shape in assistant_expected_shapes(cfg).items()
    }
    entries = scan_checkpoint(folder)
    validate(entries, expected, "Gemma 4 assistant")
    return Assistant(
        cfg, load_tensors(entries, target.device, target.dtype, None, progress), target.device, target.dtype
    )


def load_draft_model_config(folder: str | Path) -> DraftConfig | AssistantConfig:
    """The config of a draft model folder: a DFlash drafter's or a Gemma 4 MTP assistant's."""
    return load_assistant_config(folder) if is_assistant_folder(folder) else load_draft_config(folder)
