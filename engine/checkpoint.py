"""What `flashdesk doctor --model DIR` says about a checkpoint folder, and the memory it will need.

Why its own module: the checks are the loader's own (`load_config`, `scan_checkpoint`, `validate`),
run without loading a byte of weights, so a folder that passes here is one the engine will load;
and the KV figure is computed from the same rule `kv_cache.py` allocates by (a test holds the two
equal), so the estimate cannot drift from the engine.

Every failure becomes a `problem` line carrying the loader's message; nothing here raises on a bad
folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flashdesk.engine.config import Gemma4Config, load_config
from flashdesk.engine.errors import FlashDeskError
from flashdesk.engine.kv_cache import FP8, STORAGE_DTYPES
from flashdesk.engine.speculative import PREFILL_CHUNK
from flashdesk.engine.weights import (DTYPE_SIZES, TOWER_PREFIXES, checkpoint_files, expected_shapes,
                                      read_header, scan_checkpoint, validate)

DEFAULT_CONTEXT = 32768
GPU_KV_DTYPE = "fp8"  # what `--kv-dtype auto` picks on CUDA
# CUDA context, allocator caching/fragmentation, logits, MLP/MoE activations of a prefill chunk
WORKSPACE_FIXED_BYTES = 1 << 30
# Peak of the plain-torch attention (kernels/attention.py) in fp32 score matrices [Hq, T, S]: the
# scores and their softmax alive together, plus the bf16 copy of the probabilities.
SCORE_MATRICES_AT_PEAK = 2.5


def kv_cache_bytes(cfg: Gemma4Config, context: int, kv_dtype: str, slack: int = 16) -> int:
    """Bytes `Gemma4.new_cache(context, kv_dtype, slack)` allocates, computed without allocating.

    Full-attention layers hold `context` positions, sliding layers a ring of min(context, window +
    slack); each position holds K and V of num_kv_heads x head_dim in the storage dtype, and for fp8
    one fp32 scale per (position, KV head) for K and one for V.
    """
    if kv_dtype not in STORAGE_DTYPES:
        raise ValueError(f"unknown KV storage dtype {kv_dtype!r}; choose from {', '.join(STORAGE_DTYPES)}")
    dtype = STORAGE_DTYPES[kv_dtype]
    element = dtype.itemsize
    scale = 4 if dtype == FP8 else 0  # torch.float32 scales, one for K and one for V
    total = 0
    for layer in cfg.layers:
        positions = min(context, cfg.sliding_window + slack) if layer.sliding else context
        total += positions * 2 * layer.num_kv_heads * (layer.head_dim * element + scale)
    return total


def loaded_weight_bytes(cfg: Gemma4Config, dtype_bytes: int = 2) -> int:
    """Bytes the text model holds on the device when loaded in a `dtype_bytes` dtype (bf16: 2).

    The model keeps its norm weights in fp32 whatever the load dtype (gemma4.py), the rest as loaded.
    """
    total = 0
    for name, shape in expected_shapes(cfg).items():
        numel = 1
        for dim in shape:
            numel *= dim
        total += numel * (4 if _is_norm(name) else dtype_bytes)
    return total


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight") or "layernorm" in name


def workspace_bytes(cfg: Gemma4Config, context: int, chunk: int = PREFILL_CHUNK) -> int:
    """The activation/workspace allowance at `context` tokens, for bf16 compute.

    A fixed 1 GiB, plus the attention of the last prefill chunk (`chunk` queries) over the keys it
    sees: the plain-torch attention materializes [heads, chunk, keys] fp32 scores (about 2.5 such
    matrices at its peak) and [chunk, keys] position deltas and masks (int64 + bool), and reads the
    layer's K and V back dequantized (fp32, then bf16). On full layers the keys are the whole
    context, so this term grows with it; a fused attention kernel would remove most of it.
    """
    chunk = max(1, min(chunk, context))
    attn = 0
    for layer in cfg.layers:
        keys = min(context, cfg.sliding_window - 1 + chunk) if layer.sliding else context
        scores = int(SCORE_MATRICES_AT_PEAK * cfg.num_heads * chunk * keys * 4) + chunk * keys * (8 + 2)
        readback = 2 * keys * layer.num_kv_heads * layer.head_dim * (4 + 2)
        attn = max(attn, scores + readback)
    return WORKSPACE_FIXED_BYTES + attn


def format_bytes(n: int | float) -> str:
    """Human-readable binary size: 512 B, 3.5 KiB, 12.0 MiB, 47.02 GiB."""
    if n < 1024:
        return f"{int(n)} B"
    for unit, div in (("KiB", 1024), ("MiB", 1024**2)):
        if n < div * 1024:
            return f"{n / div:.1f} {unit}"
    return f"{n / 1024**3:.2f} GiB"


@dataclass(frozen=True)
class MemoryEstimate:
    """Device memory at `context` tokens: bf16 weights + the KV cache + the workspace allowance."""

    context: int
    weight_bytes: int
    kv_dtype: str
    kv_bytes: int
    workspace_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.workspace_bytes


@dataclass
class CheckpointReport:
    """The doctor's findings on a model folder: its lines, and the numbers behind them."""

    rows: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    config: Gemma4Config | None = None
    tensors: int | None = None
    disk_bytes: int | None = None  # text-model tensors as stored (towers excluded)
    tower_bytes: int | None = None  # vision/audio towers as stored (never loaded)
    loaded_bytes: int | None = None  # text model on the device in bf16
    memory: MemoryEstimate | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.rows.append(("problem", text))

    @property
    def lines(self) -> list[str]:
        width = max((len(label) for label, _ in self.rows), default=0)
        return [f"{label.ljust(width)}  {text}".rstrip() for label, text in self.rows]


def inspect_checkpoint(model_dir: str | Path, context: int | None = None) -> CheckpointReport:
    """Check a model folder as the loader would, and estimate its memory at `context` tokens."""
    folder = Path(model_dir)
    report = CheckpointReport()
    context = DEFAULT_CONTEXT if context is None else int(context)
    if not folder.is_dir():
        report.problem(f"{folder} is not a folder")
        return _verdict(report)
    cfg = _check_config(folder, report)
    if cfg is not None:
        _check_weights(folder, cfg, report)
    _check_tokenizer(folder, report)
    if cfg is not None:
        _estimate_memory(cfg, context, report)
    return _verdict(report)


class CheckpointLines(list):
    """The report's lines (a list of str) that also carry its `problems`, so `run_doctor` can set
    the exit code from what `describe_checkpoint` returns."""

    def __init__(self, lines: list[str], problems: list[str]):
        super().__init__(lines)
        self.problems = list(problems)


def describe_checkpoint(model_dir: str | Path, context: int | None = None) -> list[str]:
    """Human-readable lines for `flashdesk doctor --model DIR [--context N]`; `.problems` on the
    returned list is empty when the folder holds a complete, supported checkpoint."""
    report = inspect_checkpoint(model_dir, context)
    return CheckpointLines(report.lines, report.problems)


def _check_config(folder: Path, report: CheckpointReport) -> Gemma4Config | None:
    try:
        cfg = load_config(folder)
    except Exception as exc:  # noqa: BLE001 - the loader's message becomes a problem line
        report.problem(_message(exc))
        return None
    report.config = cfg
    sliding = [layer for layer in cfg.layers if layer.sliding]
    full = [layer for layer in cfg.layers if not layer.sliding]
    report.rows.append(("config", f"{cfg.architecture}, {cfg.num_layers} layers ({len(sliding)} sliding, "
                                  f"{len(full)} full), hidden {cfg.hidden_size}, {cfg.num_heads} heads, "
                                  f"vocab {cfg.vocab_size}"))
    parts = []
    if sliding:
        parts.append(f"sliding {_heads(sliding)}, window {cfg.sliding_window}")
    if full:
        parts.append(f"full {_heads(full)}" + (", K = V" if any(layer.k_eq_v for layer in full) else ""))
    report.rows.append(("attention", "; ".join(parts)))
    if cfg.enable_moe:
        report.rows.append(("experts", f"{cfg.num_experts}, top {cfg.top_k_experts}, expert intermediate "
                                       f"{cfg.moe_intermediate_size}; dense MLP {cfg.intermediate_size}"))
    else:
        report.rows.append(("experts", f"none; dense MLP {cfg.intermediate_size}"))
    report.rows.append(("context", f"limit {cfg.max_position_embeddings} tokens"))
    return cfg


def _message(exc: Exception) -> str:
    """The loader's own errors already say what and where; anything else gets its type named."""
    return str(exc) if isinstance(exc, FlashDeskError) else f"{type(exc).__name__}: {exc}"


def _heads(layers) -> str:
    shapes = sorted({(layer.num_kv_heads, layer.head_dim) for layer in layers})
    return ", ".join(f"{kv} KV head{'s' if kv > 1 else ''} x {dim}" for kv, dim in shapes)


def _check_weights(folder: Path, cfg: Gemma4Config, report: CheckpointReport) -> None:
    try:
        entries = scan_checkpoint(folder)
        validate(entries, expected_shapes(cfg))
        files = checkpoint_files(folder)
        towers = [e for path in files for name, e in read_header(path).items() if name.startswith(TOWER_PREFIXES)]
    except Exception as exc:  # noqa: BLE001 - the loader's message becomes a problem line
        report.problem(_message(exc))
        return
    report.tensors = len(entries)
    report.disk_bytes = sum(_stored_bytes(e) for e in entries.values())
    report.tower_bytes = sum(_stored_bytes(e) for e in towers)
    report.loaded_bytes = loaded_weight_bytes(cfg)
    dtypes = "+".join(sorted({e.dtype.lower() for e in entries.values()}))
    text = (f"complete: {len(entries)} tensors in {len(files)} file(s); {format_bytes(report.disk_bytes)} "
            f"on disk ({dtypes}), {format_bytes(report.loaded_bytes)} as bf16 on the GPU")
    report.rows.append(("weights", text))
    if towers:
        report.rows.append(("", f"vision/audio towers: {len(towers)} tensors, "
                                f"{format_bytes(report.tower_bytes)} on disk, never loaded"))


def _stored_bytes(entry) -> int:
    numel = 1
    for dim in entry.shape:
        numel *= dim
    return numel * DTYPE_SIZES.get(entry.dtype, 0)


def _check_tokenizer(folder: Path, report: CheckpointReport) -> None:
    """A missing tokenizer or chat template is a warning, not a problem: `generate --prompt-ids`
    runs without them; the app and `--prompt` need both."""
    files = [name for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
             if (folder / name).is_file()]
    if not any(name != "tokenizer_config.json" for name in files):
        report.rows.append(("tokenizer", "missing (no tokenizer.json): the app and --prompt need it; "
                                         "--prompt-ids works without"))
        return
    template = None
    if (folder / "chat_template.jinja").is_file():
        template = "chat_template.jinja"
    elif (folder / "chat_template.json").is_file():
        template = "chat_template.json"
    elif "tokenizer_config.json" in files:
        try:
            data = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            report.rows.append(("tokenizer", f"{' + '.join(files)}; tokenizer_config.json unreadable: {exc}"))
            return
        if isinstance(data, dict) and data.get("chat_template"):
            template = "tokenizer_config.json"
    chat = f"chat template in {template}" if template else "no chat template: the app and --prompt need one"
    report.rows.append(("tokenizer", f"{' + '.join(files)}; {chat}"))


def _estimate_memory(cfg: Gemma4Config, context: int, report: CheckpointReport) -> None:
    if context < 1:
        report.problem(f"--context must be at least 1 token, got {context}")
        return
    note = ""
    if context > cfg.max_position_embeddings:
        note = f" (the model's limit; {context} asked)"
        context = cfg.max_position_embeddings
    weights = report.loaded_bytes if report.loaded_bytes is not None else loaded_weight_bytes(cfg)
    kv = kv_cache_bytes(cfg, context, GPU_KV_DTYPE)
    kv_bf16 = kv_cache_bytes(cfg, context, "bfloat16")
    work = workspace_bytes(cfg, context)
    report.memory = MemoryEstimate(context, weights, GPU_KV_DTYPE, kv, work)
    g = format_bytes
    report.rows.append(("memory", f"{g(report.memory.total)} at {context} tokens{note}, bf16 weights, fp8 KV"))
    report.rows.append(("", f"= weights {g(weights)} + KV {g(kv)} (bf16 KV: {g(kv_bf16)}) + workspace {g(work)}"))
    report.rows.append(("", f"workspace: {g(WORKSPACE_FIXED_BYTES)} CUDA context, allocator, activations + "
                            f"{g(work - WORKSPACE_FIXED_BYTES)} attention of a {min(PREFILL_CHUNK, context)}-token "
                            "prefill chunk"))
    fit = _gpu_fit(report.memory.total)
    if fit:
        report.rows.append(("GPU 0", fit))


def _gpu_fit(needed: int) -> str | None:
    """Compare with GPU 0's free memory when torch sees one; None otherwise (never raises)."""
    try:
        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(0)
    except Exception:  # noqa: BLE001 - the estimate stands without this line
        return None
    verdict = "fits" if needed <= free else "does NOT fit"
    return f"{verdict}: {format_bytes(needed)} needed, {format_bytes(free)} free of {format_bytes(total)}"


def _verdict(report: CheckpointReport) -> CheckpointReport:
    if report.ok:
        report.rows.append(("verdict", "ok: a complete Gemma 4 checkpoint FlashDesk supports"))
    else:
        n = len(report.problems)
        report.rows.append(("verdict", f"NOT usable: {n} problem{'s' if n > 1 else ''} (see above)"))
    return report
