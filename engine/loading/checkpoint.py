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

from flashdesk.engine.model.config import (
    DraftConfig,
    Gemma4Config,
    check_pair,
    load_config,
    load_draft_config,
    read_json,
)
from flashdesk.engine.model.drafter import draft_expected_shapes
from flashdesk.engine.errors import ConfigError, FlashDeskError
from flashdesk.engine.loading.memory_plan import (
    GPU_KV_DTYPE,
    DraftModels,
    MemoryPlan,
    drafter_weight_bytes,
    format_bytes,
    int4_weight_bytes,
    kv_cache_bytes,
    loaded_weight_bytes,
    longest_context,
    plan_memory,
    planned_weight_bytes,
)
from flashdesk.engine.loading.quant import parse_quant_config, plan
from flashdesk.engine.model.assistant import (
    AssistantConfig,
    assistant_expected_shapes,
    check_assistant_pair,
    is_assistant_folder,
    load_assistant_config,
)
from flashdesk.engine.loading.weights import (
    TensorSpec,
    TOWER_PREFIXES,
    RemoteHeaders,
    checkpoint_files,
    expected_shapes,
    file_header,
    scan_checkpoint,
    stored_bytes,
    validate,
)

DEFAULT_CONTEXT = 32768


@dataclass
class CheckpointReport:
    """The doctor's findings on a model folder: its lines, and the numbers behind them."""

    rows: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    config: Gemma4Config | None = None
    tensors: int | None = None
    disk_bytes: int | None = None  # text-model tensors as stored (towers excluded)
    tower_bytes: int | None = None  # vision/audio towers as stored (never loaded)
    loaded_bytes: int | None = None  # text model on the device (bf16, int4 kept packed)
    quantized: bool = False
    formats: list[dict] = field(default_factory=list)  # weight_formats(): how each kind of weight is stored
    memory: MemoryPlan | None = None
    gpu: dict | None = None  # {"free_bytes", "total_bytes", "fits", "longest_context"} where torch sees a GPU

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


def inspect_checkpoint(
    model_dir: str | Path,
    context: int | None = None,
    draft_dir: str | Path | None = None,
    device: str = "cuda",
    flags: bool = True,
    remote: RemoteHeaders | None = None,
    assistant_dir: str | Path | None = None,
) -> CheckpointReport:
    """Check a model folder (and its draft models: `draft_dir` a DFlash drafter or an MTP assistant,
    `assistant_dir` an assistant beside a drafter) as the loader would, and plan memory at `context` tokens
    on `device` ("cuda": bf16 with fp8 KV in GPU memory; "cpu": float32 in RAM, as the engine runs
    there). `flags=False` leaves out advice phrased as command-line flags (the window's check).
    `remote`: the headers of weights files not downloaded yet (models verify on a Hub id)."""
    folder = Path(model_dir)
    report = CheckpointReport()
    context = DEFAULT_CONTEXT if context is None else int(context)
    if not folder.is_dir():
        report.problem(f"{folder} is not a folder")
        return _verdict(report)
    cpu = device == "cpu"
    cfg = _check_config(folder, report)
    if cfg is not None:
        _check_weights(folder, cfg, report, cpu, remote)
    _check_tokenizer(folder, report)
    drafts = []
    if draft_dir:
        check = _check_assistant if _is_assistant(Path(draft_dir)) else _check_drafter
        drafts.append(check(Path(draft_dir), cfg, report, cpu))
    if assistant_dir and draft_dir and _is_assistant(Path(draft_dir)):
        report.problem("two MTP assistants: give a DFlash drafter as the draft model, the assistant beside it")
    elif assistant_dir:
        drafts.append(_check_assistant(Path(assistant_dir), cfg, report, cpu))
    draft = tuple(d for d in drafts if d is not None) or None
    if cfg is not None:
        (_estimate_cpu_memory if cpu else _estimate_memory)(cfg, context, report, draft, flags)
    return _verdict(report)


class CheckpointLines(list):
    """The report's lines (a list of str) that also carry its `problems`, so `run_doctor` can set
    the exit code from what `describe_checkpoint` returns."""

    def __init__(self, lines: list[str], problems: list[str]):
        super().__init__(lines)
        self.problems = list(problems)


def describe_checkpoint(
    model_dir: str | Path, context: int | None = None, draft_dir: str | Path | None = None
) -> list[str]:
    """Human-readable lines for `flashdesk doctor --model DIR [--draft DIR] [--context N]`; `.problems`
    on the returned list is empty when the folder holds a complete, supported checkpoint."""
    report = inspect_checkpoint(model_dir, context, draft_dir)
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
    report.rows.append(
        (
            "config",
            f"{cfg.architecture}, {cfg.num_layers} layers ({len(sliding)} sliding, "
            f"{len(full)} full), hidden {cfg.hidden_size}, {cfg.num_heads} heads, "
            f"vocab {cfg.vocab_size}",
        )
    )
    parts = []
    if sliding:
        parts.append(f"sliding {_heads(sliding)}, window {cfg.sliding_window}")
    if full:
        parts.append(f"full {_heads(full)}" + (", K = V" if any(layer.k_eq_v for layer in full) else ""))
    report.rows.append(("attention", "; ".join(parts)))
    if cfg.enable_moe:
        report.rows.append(
            (
                "experts",
                f"{cfg.num_experts}, top {cfg.top_k_experts}, expert intermediate "
                f"{cfg.moe_intermediate_size}; dense MLP {cfg.intermediate_size}",
            )
        )
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


def _check_weights(
    folder: Path, cfg: Gemma4Config, report: CheckpointReport, cpu: bool = False, remote: RemoteHeaders | None = None
) -> None:
    try:
        quant = parse_quant_config(read_json(folder / "config.json", "model config"))
        entries = scan_checkpoint(folder, remote)
        specs, packed = plan(expected_shapes(cfg), entries, quant)
        validate(entries, specs)
        files = checkpoint_files(folder, remote)
        towers = [
            e for path in files for name, e in file_header(path, remote).items() if name.startswith(TOWER_PREFIXES)
        ]
    except Exception as exc:  # noqa: BLE001 - the loader's message becomes a problem line
        report.problem(_message(exc))
        return
    report.tensors = len(entries)
    report.disk_bytes = sum(stored_bytes(e) for e in entries.values())
    report.tower_bytes = sum(stored_bytes(e) for e in towers)
    report.loaded_bytes = planned_weight_bytes(specs, packed, CPU_DTYPE_BYTES if cpu else 2)
    report.quantized = bool(packed)
    report.formats = weight_formats(specs, packed)
    dtypes = "+".join(sorted({e.dtype.lower() for e in entries.values()}))
    rest = "float32" if cpu else "bf16"
    form = f"int4 ({len(packed)} packed modules, kept packed) + {rest}" if packed else rest
    text = (
        f"complete: {len(entries)} tensors in {len(files)} file(s); {format_bytes(report.disk_bytes)} "
        f"on disk ({dtypes}), {format_bytes(report.loaded_bytes)} as {form} {'in RAM' if cpu else 'on the GPU'}"
    )
    report.rows.append(("weights", text))
    if packed:
        report.rows.append(("", "; ".join(f"{f['modules']} {f['weights']} {f['format']}" for f in report.formats)))
    if towers:
        report.rows.append(
            (
                "",
                f"vision/audio towers: {len(towers)} tensors, {format_bytes(report.tower_bytes)} on disk, never loaded",
            )
        )


def weight_formats(specs: dict, packed: list) -> list[dict]:
    """How the checkpoint stores each kind of weight: [{"weights": "linear" or "experts", "format":
    "int4 group 32, symmetric" / "int4 per row, asymmetric" / "16-bit", "modules": count}], so a
    reader sees at once, e.g., dense MLPs left in 16 bits beside int4 experts."""
    counts: dict[tuple[str, str], int] = {}
    for module in packed:
        in_features = specs[module.parts[0] + "packed"].shape[-1] * 8
        group = "per row" if module.group_size == in_features else f"group {module.group_size}"
        kind = "experts" if ".experts." in module.dense_name + "." else "linear"
        key = (kind, f"int4 {group}, {'symmetric' if module.symmetric else 'asymmetric'}")
        counts[key] = counts.get(key, 0) + 1
    packed_names = {module.dense_name for module in packed}
    for name in specs:
        if name in packed_names or not name.endswith(("_proj.weight", "experts.gate_up_proj", "experts.down_proj")):
            continue
        key = ("experts" if ".experts." in name + "." else "linear", "16-bit")
        counts[key] = counts.get(key, 0) + 1
    return [{"weights": kind, "format": fmt, "modules": n} for (kind, fmt), n in sorted(counts.items())]


def _check_tokenizer(folder: Path, report: CheckpointReport) -> None:
    """A missing tokenizer or chat template is a warning, not a problem: `generate --prompt-ids`
    runs without them; the app and `--prompt` need both."""
    files = [
        name for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json") if (folder / name).is_file()
    ]
    if not any(name != "tokenizer_config.json" for name in files):
        report.rows.append(
            ("tokenizer", "missing (no tokenizer.json): the app and --prompt need it; --prompt-ids works without")
        )
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


def inspect_drafter(folder: str | Path, remote: RemoteHeaders | None = None) -> CheckpointReport:
    """A DFlash drafter folder on its own (no target to pair it with): its config and tensors."""
    report = CheckpointReport()
    _check_drafter(Path(folder), None, report, remote=remote)
    return _verdict(report, "a complete DFlash drafter FlashDesk supports (pair it with its target)")


def inspect_assistant(folder: str | Path, remote: RemoteHeaders | None = None) -> CheckpointReport:
    """A Gemma 4 MTP assistant folder on its own: its config and every tensor, as the loader checks them."""
    report = CheckpointReport()
    _check_assistant(Path(folder), None, report, remote=remote)
    return _verdict(report, "a complete Gemma 4 MTP assistant FlashDesk supports (pair it with its target)")


def _check_assistant(
    folder: Path,
    cfg: Gemma4Config | None,
    report: CheckpointReport,
    cpu: bool = False,
    remote: RemoteHeaders | None = None,
) -> AssistantConfig | None:
    try:
        assistant = load_assistant_config(folder)
        if cfg is not None:
            check_assistant_pair(cfg, assistant, f"assistant {folder}")
        expected = {
            name: TensorSpec(shape, "int") if name.endswith("token_ordering") else TensorSpec(shape)
            for name, shape in assistant_expected_shapes(assistant).items()
        }
        entries = scan_checkpoint(folder, remote)
        validate(entries, expected, "Gemma 4 assistant")
    except Exception as exc:  # noqa: BLE001 - the loader's message becomes a problem line
        report.problem(_message(exc))
        return None
    text = assistant.text
    head = (
        f"ordered embeddings ({assistant.centroid_top_k} of {assistant.num_centroids} centroids)"
        if assistant.use_ordered_embeddings
        else "the tied head over the whole vocabulary"
    )
    loaded = format_bytes(drafter_weight_bytes(assistant, CPU_DTYPE_BYTES if cpu else 2))
    report.rows.append(
        (
            "assistant",
            f"Gemma 4 MTP, {text.num_layers} layers of width {text.hidden_size}, for a target of width "
            f"{assistant.backbone_hidden_size}; logits from {head}; {loaded} as {'float32' if cpu else 'bf16'}",
        )
    )
    if cfg is None:
        report.tensors = len(entries)
        report.disk_bytes = sum(stored_bytes(e) for e in entries.values())
        report.rows.append(("weights", f"complete: {len(entries)} tensors, {format_bytes(report.disk_bytes)} on disk"))
    return assistant


def _check_drafter(
    folder: Path,
    cfg: Gemma4Config | None,
    report: CheckpointReport,
    cpu: bool = False,
    remote: RemoteHeaders | None = None,
) -> DraftConfig | None:
    try:
        draft = load_draft_config(folder)
        if cfg is not None:
            check_pair(cfg, draft, f"drafter {folder}")
        validate(scan_checkpoint(folder, remote), draft_expected_shapes(draft), "DFlash drafter")
    except Exception as exc:  # noqa: BLE001 - the loader's message becomes a problem line
        report.problem(_message(exc))
        return None
    report.rows.append(
        (
            "drafter",
            f"DFlash, {draft.num_layers} layers, block {draft.block_size} (drafts up to "
            f"{draft.block_size - 1}), taps target layers {list(draft.target_layer_ids)}; "
            f"{format_bytes(drafter_weight_bytes(draft, CPU_DTYPE_BYTES if cpu else 2))} "
            f"as {'float32' if cpu else 'bf16'}",
        )
    )
    return draft


def _is_assistant(folder: Path) -> bool:
    """Whether the draft folder holds an MTP assistant (an unreadable config is the drafter check's to report)."""
    try:
        return is_assistant_folder(folder)
    except ConfigError:
        return False


def _context(cfg: Gemma4Config, context: int, report: CheckpointReport, flags: bool) -> tuple[int | None, str]:
    """The context the plan is for (the model's limit at most) and a note when it was cut; None
    (a problem recorded) when it is impossible."""
    if context < 1:
        report.problem(f"{'--context' if flags else 'the context'} must be at least 1 token, got {context}")
        return None, ""
    if context > cfg.max_position_embeddings:
        return cfg.max_position_embeddings, f" (the model's limit; {context} asked)"
    return context, ""


def _estimate_cpu_memory(
    cfg: Gemma4Config,
    context: int,
    report: CheckpointReport,
    draft: DraftModels,
    flags: bool = True,
) -> None:
    """RAM on the CPU: float32 weights (int4 kept packed), KV and work buffers, as the engine runs there."""
    planned, note = _context(cfg, context, report, flags)
    if planned is None:
        return
    context = planned
    weights = report.loaded_bytes if report.loaded_bytes is not None else loaded_weight_bytes(cfg, CPU_DTYPE_BYTES)
    memory = plan_memory(cfg, weights, context, "float32", draft, dtype_bytes=CPU_DTYPE_BYTES, triton=False)
    report.memory = memory
    head, parts = memory.lines()
    report.rows.append(("memory", f"{head} of RAM on the CPU{note}, float32 KV"))
    report.rows.append(("", parts))


def _estimate_memory(
    cfg: Gemma4Config,
    context: int,
    report: CheckpointReport,
    draft: DraftModels,
    flags: bool = True,
) -> None:
    planned, note = _context(cfg, context, report, flags)
    if planned is None:
        return
    context = planned
    weights = report.loaded_bytes if report.loaded_bytes is not None else loaded_weight_bytes(cfg)
    memory = plan_memory(cfg, weights, context, GPU_KV_DTYPE, draft)
    report.memory = memory
    head, parts = memory.lines()
    report.rows.append(
        ("memory", f"{head}{note}, fp8 KV (bf16 KV: {format_bytes(kv_cache_bytes(cfg, context, 'bfloat16'))})")
    )
    report.rows.append(("", parts))
    if not report.quantized and flags:
        int4 = plan_memory(cfg, int4_weight_bytes(cfg), context, GPU_KV_DTYPE, draft)
        report.rows.append(("", f"with --quantize int4: {format_bytes(int4.total)}"))
    free = _gpu_free()
    if free is not None:
        free_bytes, total = free
        fits = memory.total <= free_bytes
        longest = longest_context(cfg, weights, GPU_KV_DTYPE, free_bytes, draft)
        report.gpu = {"free_bytes": free_bytes, "total_bytes": total, "fits": fits, "longest_context": longest}
        report.rows.append(
            (
                "GPU 0",
                f"{'fits' if fits else 'does NOT fit'}: {format_bytes(memory.total)} needed, "
                f"{format_bytes(free_bytes)} free of {format_bytes(total)}; longest context "
                f"that fits: {longest} tokens",
            )
        )


CPU_DTYPE_BYTES = 4  # float32: what the engine computes in on the CPU (bf16 matmuls are slow there)


def _gpu_free() -> tuple[int, int] | None:
    """GPU 0's (free, total) bytes when torch sees one; None otherwise (never raises)."""
    try:
        if not torch.cuda.is_available():
            return None
        return torch.cuda.mem_get_info(0)
    except Exception:  # noqa: BLE001 - the estimate stands without this line
        return None


def _verdict(
    report: CheckpointReport, what: str = "a complete Gemma 4 checkpoint FlashDesk supports"
) -> CheckpointReport:
    if report.ok:
        report.rows.append(("verdict", f"ok: {what}"))
    else:
        n = len(report.problems)
        report.rows.append(("verdict", f"NOT usable: {n} problem{'s' if n > 1 else ''} (see above)"))
    return report
