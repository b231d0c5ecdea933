"""Read a Gemma 4 checkpoint's safetensors, check every tensor against the config, stream them to the device.

Why its own reader: we validate each file's header (names, shapes, dtypes, sizes) before loading a
byte, so a damaged or mismatched checkpoint fails fast with the tensor and file named, and we load
tensor by tensor so the model never exists twice in memory.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open

from flashdesk.engine.model.config import Gemma4Config
from flashdesk.engine.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Gemma4ForConditionalGeneration keeps the text model under `model.language_model.`; a
# Gemma4ForCausalLM export under `model.`. The towers below exist in the former and are never loaded.
TEXT_PREFIXES = ("model.language_model.", "model.")
TOWER_PREFIXES = (
    "model.vision_tower.",
    "model.embed_vision.",
    "model.audio_tower.",
    "model.embed_audio.",
    "model.multi_modal_projector.",
)
IGNORED_NAMES = ("lm_head.weight",)  # a tied head stored anyway: the embedding is the head
FLOAT_DTYPES = {"BF16": 2, "F16": 2, "F32": 4}
DTYPE_SIZES = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "I8": 1,
    "U8": 1,
    "I16": 2,
    "I32": 4,
    "I64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}


@dataclass(frozen=True)
class TensorSpec:
    """What a checkpoint must hold under one name: a shape and a kind of dtype."""

    shape: tuple[int, ...]
    kind: str = "float"  # "float" (BF16/F16/F32), "int32" (packed int4), "int" (any integer: shapes)
    optional: bool = False


KIND_DTYPES = {"float": tuple(FLOAT_DTYPES), "int32": ("I32",), "int": ("I32", "I64", "U32", "U64")}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a safetensors header describes it."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]


class RemoteHeaders(Protocol):
    """Safetensors headers of a checkpoint whose weights are not on disk yet (a Hub repository
    before its download finished): what `models verify` reads instead of the files."""

    def files(self) -> list[str]:
        """The repository's top-level *.safetensors files."""

    def header(self, name: str) -> dict[str, "TensorEntry"]:
        """The entries of one file's header, checked as read_header checks a file on disk."""


def read_header(path: Path) -> dict[str, TensorEntry]:
    """Parse a safetensors header and check that the file holds every byte it announces."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file (no header)")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > size - 8:
                raise CheckpointError(
                    f"{path}: truncated safetensors file (header of {header_len} bytes in a file of {size})"
                )
            raw = f.read(header_len)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc}") from exc
    return parse_header(raw, size - 8 - header_len, path)


def parse_header(raw: bytes, data_size: int, path: Path, where: str | None = None) -> dict[str, TensorEntry]:
    """The entries of a safetensors header (its JSON bytes), each checked to fit the `data_size`
    bytes after it and to hold exactly its shape's bytes; `where` names the file in errors
    (default: path)."""
    where = where or str(path)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where}: corrupt safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: corrupt safetensors header: not a JSON object")
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info.get("dtype"), tuple(info.get("shape", ()))
        start, end = info.get("data_offsets", (0, 0))
        if end > data_size:
            raise CheckpointError(
                f"{where}: truncated: tensor {name} ends at byte {end} of the data "
                f"section but the file holds only {data_size}"
            )
        numel = 1
        for dim in shape:
            numel *= dim
        if dtype in DTYPE_SIZES and end - start != numel * DTYPE_SIZES[dtype]:
            raise CheckpointError(f"{where}: tensor {name} has {end - start} bytes for shape {list(shape)} of {dtype}")
        entries[name] = TensorEntry(name, path, dtype, shape)
    return entries


def checkpoint_files(model_dir: Path, remote: RemoteHeaders | None = None) -> list[Path]:
    """The safetensors files of a checkpoint: those of the index, or the single file. With
    `remote`, files not on disk may be the repository's (their headers come from there)."""
    listed = set(remote.files()) if remote else set()
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index: {exc}") from exc
        files = sorted(set(weight_map.values()))
        missing = [name for name in files if not (model_dir / name).is_file() and name not in listed]
        if missing:
            raise CheckpointError(
                f"{model_dir}: shard file(s) named in {INDEX_FILE} are missing: " + ", ".join(missing)
            )
        return [model_dir / name for name in files]
    if (model_dir / SINGLE_FILE).is_file() or SINGLE_FILE in listed:
        return [model_dir / SINGLE_FILE]
    raise CheckpointError(f"{model_dir}: no {INDEX_FILE} and no {SINGLE_FILE}: not a safetensors checkpoint")


def file_header(path: Path, remote: RemoteHeaders | None = None) -> dict[str, TensorEntry]:
    """One file's header: from disk, or from `remote` for a file not downloaded yet."""
    if remote is not None and not path.is_file():
        return remote.header(path.name)
    return read_header(path)


def scan_checkpoint(model_dir: str | Path, remote: RemoteHeaders | None = None) -> dict[str, TensorEntry]:
    """Every text-model tensor of a checkpoint, keyed by its name without the layout prefix."""
    model_dir = Path(model_dir)
    entries: dict[str, TensorEntry] = {}
    for path in checkpoint_files(model_dir, remote):
        for name, entry in file_header(path, remote).items():
            if name.startswith(TOWER_PREFIXES) or name in IGNORED_NAMES:
                continue
            short = next((name[len(p) :] for p in TEXT_PREFIXES if name.startswith(p)), name)
            if short in entries:
                raise CheckpointError(f"tensor {name} appears twice: in {entries[short].file.name} and {path.name}")
            entries[short] = TensorEntry(name, path, entry.dtype, entry.shape)
    return entries


def expected_shapes(cfg: Gemma4Config) -> dict[str, tuple[int, ...]]:
    """The name and shape of every text-model tensor the config implies (names without prefix)."""
    d, n_heads = cfg.hidden_size, cfg.num_heads
    shapes = {"embed_tokens.weight": (cfg.vocab_size, d), "norm.weight": (d,)}
    norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
    if cfg.enable_moe:
        norms += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"]
    for i, layer in enumerate(cfg.layers):
        p = f"layers.{i}."
        for norm in norms:
            shapes[p + norm + ".weight"] = (d,)
        dh, kv = layer.head_dim, layer.num_kv_heads
        shapes[p + "self_attn.q_proj.weight"] = (n_heads * dh, d)
        shapes[p + "self_attn.k_proj.weight"] = (kv * dh, d)
        if not layer.k_eq_v:
            shapes[p + "self_attn.v_proj.weight"] = (kv * dh, d)
        shapes[p + "self_attn.o_proj.weight"] = (d, n_heads * dh)
        shapes[p + "self_attn.q_norm.weight"] = (dh,)
        shapes[p + "self_attn.k_norm.weight"] = (dh,)
        shapes[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, d)
        shapes[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, d)
        shapes[p + "mlp.down_proj.weight"] = (d, cfg.intermediate_size)
        shapes[p + "layer_scalar"] = (1,)
        if cfg.enable_moe:
            e, im = cfg.num_experts, cfg.moe_intermediate_size
            shapes[p + "router.proj.weight"] = (e, d)
            shapes[p + "router.scale"] = (d,)
            shapes[p + "router.per_expert_scale"] = (e,)
            shapes[p + "experts.gate_up_proj"] = (e, 2 * im, d)
            shapes[p + "experts.down_proj"] = (e, d, im)
    return shapes


def validate(entries: dict[str, TensorEntry], expected: dict, what: str = "Gemma 4 text model") -> None:
    """Raise CheckpointError for the first missing, extra, misshapen or wrongly typed tensor.

    `expected` maps names to a shape (a float tensor) or a TensorSpec.
    """
    specs = {name: spec if isinstance(spec, TensorSpec) else TensorSpec(tuple(spec)) for name, spec in expected.items()}
    missing = [name for name, spec in specs.items() if name not in entries and not spec.optional]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor {missing[0]}{more}: the checkpoint does not match its config.json")
    for name, entry in entries.items():
        if name not in specs:
            raise CheckpointError(
                f"unexpected tensor {entry.name} in {entry.file.name}: not part of the "
                f"{what} this config.json describes; {_unknown_hint(name)}"
            )
        spec = specs[name]
        if entry.shape != spec.shape:
            raise CheckpointError(
                f"tensor {entry.name} in {entry.file.name} has shape {list(entry.shape)}, "
                f"expected {list(spec.shape)} from config.json"
            )
        if entry.dtype not in KIND_DTYPES[spec.kind]:
            raise CheckpointError(
                f"tensor {entry.name} in {entry.file.name} has dtype {entry.dtype}; "
                f"expected one of {', '.join(KIND_DTYPES[spec.kind])}"
            )


def _unknown_hint(name: str) -> str:
    """What to do about a tensor no part of the model reads (one clause, for the refusal's line)."""
    if name.endswith("g_idx"):
        return (
            "it is a GPTQ activation order (g_idx), which FlashDesk does not read: use an export "
            "without activation order (compressed-tensors W4A16, group or channel scales)"
        )
    if name.endswith(("input_scale", "weight_global_scale", "input_global_scale", "k_scale", "v_scale")):
        return "it belongs to a quantization of activations or the KV cache, which FlashDesk does not read"
    return (
        "check that config.json belongs to these weights; if it is an export of a supported model, "
        "`flashdesk models verify FOLDER --json` gives the details to send with a report"
    )


def load_tensors(
    entries: dict[str, TensorEntry], device: torch.device, dtype: torch.dtype, transform=None, progress=None
) -> dict[str, torch.Tensor]:
    """Stream validated tensors to `device` one at a time: floats as `dtype`, integers as stored.

    `transform(name, tensor)` may replace each tensor as it arrives (on-load quantization), so the
    unconverted tensor never accumulates. `progress(done_bytes, total_bytes)` follows the bytes read.
    """
    weights: dict = {}
    total = sum(stored_bytes(e) for e in entries.values())
    done = 0
    by_file: dict[Path, list[str]] = {}
    for short, entry in entries.items():
        by_file.setdefault(entry.file, []).append(short)
    for path, names in by_file.items():
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for short in names:
                    tensor = f.get_tensor(entries[short].name)
                    tensor = tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else tensor.dtype)
                    weights[short] = transform(short, tensor) if transform else tensor
                    if progress:
                        done += stored_bytes(entries[short])
                        progress(done, total)
        except CheckpointError:
            raise
        except Exception as exc:  # safetensors raises its own error types for damaged data
            raise CheckpointError(f"{path}: cannot read tensors: {exc}") from exc
    return weights


def stored_bytes(entry: TensorEntry) -> int:
    """Bytes a tensor takes in its file."""
    numel = 1
    for dim in entry.shape:
        numel *= dim
    return numel * DTYPE_SIZES.get(entry.dtype, 0)
