"""`flashdesk bench`: AR and DFlash (several draft lengths, and automatic) by task type, in one run.

Every mode decodes the same prompts with the same settings in the same process, one prompt in every
mode back to back before the next prompt (interleaved), so drift in the machine's load or clocks
hits all modes alike and the ratios (speedup over AR per task type, our speed over transformers'
generate and over z-lab's reference loop) compare like with like on this machine. Absolute numbers
depend on the card; the ratios are the point. Every request prefills from scratch (no prefix
reuse), so each mode's time to first token is measured the same way.

Per cell (task type x mode): decode tok/s, time to first token (the prefill, which yields the first
token), tau (mean acceptance length: tokens per speculative step, bonus included), acceptance rate
and acceptance by position, the mean draft length (the automatic mode's choice), and joules per
decoded token from NVML's energy counter on a GPU. Results are kept per (device, driver, model,
drafter) in the data folder, a list of runs, newest last, with a PNG chart of the latest run.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flashdesk import paths
from flashdesk.engine.decode.chat import build_prompt_ids, messages_from
from flashdesk.engine.decode.generation import Engine, FinishEvent, GenerationRequest
from flashdesk.engine.decode.speculative import AUTO, SpecControl
from flashdesk.engine.decode.stats import SpecStats, StepRecord
from flashdesk.engine.errors import FlashDeskError

TASKS = ("code", "math", "reasoning", "chat", "summarization", "translation")
PROMPTS_DIR = paths.assets_dir() / "prompts"  # one JSON-lines file per task type, {"task", "prompt"}
DEFAULT_PROMPTS_PER_TASK = 4  # keeps a run short (a CPU demo run: seconds); --full takes them all
AUTO_MODE = "DFlash auto"
KEPT_RUNS = 100  # runs a results file keeps, newest last


# -- prompts -----------------------------------------------------------------------------------


def _read_jsonl(path: Path, default_task: str) -> list[dict]:
    """JSON lines with "prompt" (and "task" or "category"), or plain text, one prompt per line."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                item = json.loads(line)
                task = item.get("task") or item.get("category") or default_task
                prompts.append({"prompt": str(item["prompt"]), "task": str(task)})
            except (ValueError, KeyError, AttributeError) as exc:
                raise FlashDeskError(f"{path}:{number}: not a JSON object with a \"prompt\": {exc}") from exc
        else:
            prompts.append({"prompt": line, "task": default_task})
    return prompts


def load_prompts(path: str | Path) -> list[dict]:
    """A prompts file of your own: items {"prompt", "task"} ("category" is read as the task; "other"
    when neither is given)."""
    path = Path(path)
    if not path.is_file():
        raise FlashDeskError(f"prompts file not found: {path}")
    prompts = _read_jsonl(path, "other")
    if not prompts:
        raise FlashDeskError(f"{path} holds no prompts")
    return prompts


def task_prompts(task: str, folder: Path = PROMPTS_DIR) -> list[dict]:
    """The built-in prompts of one task type, in file order."""
    path = folder / f"{task}.jsonl"
    if not path.is_file():
        raise FlashDeskError(f"the built-in prompts of task type {task!r} are missing: {path}")
    return [dict(p, task=task) for p in _read_jsonl(path, task)]


def parse_tasks(text: str | None, known: list[str]) -> list[str]:
    """--tasks: a comma-separated subset of `known` (default: all of them), in the order given."""
    if text is None:
        return list(known)
    tasks = []
    for name in (part.strip().lower() for part in text.split(",")):
        if not name:
            continue
        if name not in known:
            raise ValueError(f"--tasks: unknown task type {name!r}; choose from {', '.join(known)}")
        if name not in tasks:
            tasks.append(name)
    if not tasks:
        raise ValueError(f"--tasks is empty; choose from {', '.join(known)}")
    return tasks


def select_prompts(items: list[dict], tasks: list[str], per_task: int | None) -> list[dict]:
    """The first `per_task` prompts of each task type (all when None), taken round-robin across the
    task types (code 1, math 1, ..., code 2, ...), so a run interrupted or drifting half-way still
    covers every type alike."""
    by_task = {t: [p for p in items if p["task"] == t][:per_task] for t in tasks}
    out = []
    for i in range(max((len(v) for v in by_task.values()), default=0)):
        out += [by_task[t][i] for t in tasks if i < len(by_task[t])]
    return out


def parse_draft_lengths(text: str) -> list[int | str]:
    """--draft-lengths: whole numbers and `auto`, comma-separated (duplicates dropped)."""
    lengths: list[int | str] = []
    for part in (p.strip().lower() for p in str(text).split(",")):
        if not part:
            continue
        if part == AUTO:
            value: int | str = AUTO
        else:
            try:
                value = int(part)
            except ValueError:
                raise ValueError(f"--draft-lengths: {part!r} is not a draft length; give whole numbers "
                                 f"(1..the drafter's block size - 1) or {AUTO}, comma-separated") from None
        if value not in lengths:
            lengths.append(value)
    if not lengths:
        raise ValueError(f"--draft-lengths is empty; give draft lengths such as 4,8,15,{AUTO}")
    return lengths


def mode_name(draft_length: int | str) -> str:
    if draft_length == AUTO:
        return AUTO_MODE
    return "AR" if draft_length == 0 else f"DFlash K={draft_length}"


# -- the device: its name, driver and energy counter ---------------------------------------------


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


class DeviceProbe:
    """The device's name and driver (the results key) and NVML's energy counter on a GPU."""

    def __init__(self, device: torch.device):
        self.nvml = self.handle = None
        self.energy_note = "n/a on the CPU"
        if device.type != "cuda":
            self.name, self.driver = cpu_name(), "cpu"
            return
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.name, self.driver = torch.cuda.get_device_name(index), "driver unknown"
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - no NVML: no energy, the rest still runs
            self.energy_note = f"n/a (NVML unavailable: {exc})"
            return
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            self.driver = driver.decode() if isinstance(driver, bytes) else str(driver)
            self.handle = self._handle(pynvml, index)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.energy_note = "NVML energy counter"
        except Exception as exc:  # noqa: BLE001 - e.g. a GPU older than Volta has no energy counter
            self.handle = None
            self.energy_note = f"n/a (NVML energy counter: {exc})"

    @staticmethod
    def _handle(pynvml, index: int):
        """NVML's handle of torch's device `index`: by PCI bus id (CUDA_VISIBLE_DEVICES may renumber)."""
        try:
            p = torch.cuda.get_device_properties(index)
            bus_id = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
            return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except Exception:  # noqa: BLE001 - an older torch without the PCI fields
            return pynvml.nvmlDeviceGetHandleByIndex(index)

    def energy_mj(self) -> float | None:
        """The GPU's energy counter in millijoules (since the driver loaded), or None."""
        if self.handle is None:
            return None
        try:
            return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:  # noqa: BLE001
            return None

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.nvml = self.handle = None


# -- measuring ---------------------------------------------------------------------------------


@dataclass
class Cell:
    """One task type in one mode (or one mode over all task types): sums over its prompts."""

    stats: SpecStats = field(default_factory=SpecStats)
    prompts: int = 0
    prefill_seconds: float = 0.0
    energy_mj: float | None = 0.0  # None once a reading is missing

    def as_dict(self, baseline: float | None) -> dict:
        s = self.stats.summary()
        tps = s["decode_tokens_per_second"]
        joules = self.energy_mj / 1000.0 if self.energy_mj is not None else None
        return {
            "prompts": self.prompts, "decode_tokens": s["decode_tokens"], "decode_seconds": s["decode_seconds"],
            "tokens_per_second": tps, "speedup_over_ar": tps / baseline if baseline else None,
            "ttft_seconds": self.prefill_seconds / self.prompts if self.prompts else None,
            "acceptance_rate": s["acceptance_rate"], "mean_acceptance_length": s["mean_acceptance_length"],
            "acceptance_by_position": s["per_position_acceptance"], "accepted_histogram": s["accepted_histogram"],
            "steps": s["steps"], "speculative_steps": s["speculative_steps"],
            "mean_draft_length": s["drafted"] / s["speculative_steps"] if s["speculative_steps"] else None,
            "tokens_per_step": s["decode_tokens"] / s["steps"] if s["steps"] else None,
            "energy_joules": joules,
            "joules_per_token": joules / s["decode_tokens"] if joules is not None and s["decode_tokens"] else None,
        }


@dataclass
class ModeResult:
    """One of our modes: AR (draft length 0), DFlash at a fixed K, or DFlash auto; per task and in all."""

    name: str
    draft_length: int | str = 0
    total: Cell = field(default_factory=Cell)
    cells: dict = field(default_factory=dict)  # task type -> Cell
    per_prompt: list = field(default_factory=list)

    def control(self) -> SpecControl:
        return SpecControl(enabled=self.draft_length != 0, draft_length=self.draft_length or None)

    @property
    def tokens_per_second(self) -> float:
        return self.total.stats.summary()["decode_tokens_per_second"]

    def as_dict(self, baseline: "ModeResult | None") -> dict:
        """Today's fields (mode, draft_length, decode_tokens, ... per_prompt), the per-cell statistics
        over all prompts, and `by_task`: the same per task type, speedup against AR's on that type."""
        out = {"mode": self.name, "draft_length": self.draft_length}
        out.update(self.total.as_dict(baseline.tokens_per_second if baseline else None))
        out["per_prompt"] = self.per_prompt
        out["by_task"] = {
            task: cell.as_dict(baseline.cells[task].stats.summary()["decode_tokens_per_second"]
                               if baseline and task in baseline.cells else None)
            for task, cell in self.cells.items()}
        return out


def run_ours(engine: Engine, ids: list[int], task: str, max_new: int, result: ModeResult,
             energy=lambda: None) -> list[int]:
    """Decode one prompt greedily in one mode, from a cold prefill; add its steps to the mode's cell
    for `task` and to its total. Energy is read after the prefill and at the end: decode only."""
    cell = result.cells.setdefault(task, Cell())
    start = finish = None
    records = []
    for event in engine.generate(GenerationRequest(ids, max_new, reuse=False), result.control()):
        if isinstance(event, FinishEvent):
            finish = event
        elif event.index == 0:
            start = energy()
        else:
            records.append(StepRecord(tuple(event.draft), event.accepted, tuple(event.emitted),
                                      event.draft_seconds, event.verify_seconds))
    end = energy()
    joules = end - start if start is not None and end is not None else None
    s = finish.stats
    for c in (cell, result.total):
        for record in records:
            c.stats.add(record)
        c.prompts += 1
        c.prefill_seconds += s["prefill_seconds"]
        c.energy_mj = c.energy_mj + joules if c.energy_mj is not None and joules is not None else None
    result.per_prompt.append({"task": task, "tokens": len(finish.token_ids), "ttft_seconds": s["prefill_seconds"],
                              "decode_tokens_per_second": s["decode_tokens_per_second"],
                              "acceptance_rate": s["acceptance_rate"], "token_ids": finish.token_ids})
    return finish.token_ids


@dataclass
class RefResult:
    """A reference implementation's totals (--compare)."""

    name: str
    draft_length: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def _sync(device) -> float:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def reference_models(model_dir: str, draft_dir: str, device, dtype):
    """transformers' Gemma 4 and z-lab's DFlashDraftModel on the same files (for --compare)."""
    import transformers

    try:
        from dflash.model import DFlashDraftModel
    except ImportError:
        raise FlashDeskError("--compare needs z-lab's reference: pip install --no-deps dflash==0.1.0") from None
    config = json.loads((Path(model_dir) / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    target = cls.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    drafter = DFlashDraftModel.from_pretrained(draft_dir, dtype=dtype).to(device).eval()
    # dflash's loop embeds without Gemma's sqrt(hidden); tell it, as vLLM and mlx do for Gemma targets
    drafter.config.dflash_config = dict(getattr(drafter.config, "dflash_config", {}) or {},
                                        input_embedding_scale=math.sqrt(drafter.config.hidden_size))
    return target, drafter


def run_transformers(target, ids: list[int], max_new: int, stop: list[int], result: RefResult) -> None:
    """transformers' greedy generate: decode time = the whole call minus a 1-token call (the prefill)."""
    device = target.device
    x = torch.tensor([ids], device=device)
    with torch.inference_mode():
        t0 = _sync(device)
        target.generate(x, max_new_tokens=1, do_sample=False, eos_token_id=stop, pad_token_id=0)
        t1 = _sync(device)
        seq = target.generate(x, max_new_tokens=max_new, do_sample=False, eos_token_id=stop, pad_token_id=0)
        t2 = _sync(device)
    result.decode_tokens += seq.shape[1] - len(ids) - 1  # all but the prefill's token
    result.decode_seconds += max((t2 - t1) - (t1 - t0), 1e-9)


def run_reference(target, drafter, ids: list[int], max_new: int, stop: list[int], result: RefResult) -> None:
    """z-lab's dflash_generate; its own timer starts after the prefill."""
    import dflash.model as dflash_model

    res = dflash_model.dflash_generate(drafter, target, torch.tensor([ids], device=target.device), max_new, stop,
                                       block_size=result.draft_length + 1, return_stats=True)
    result.decode_tokens += res.num_output_tokens - 1
    result.decode_seconds += res.time_per_output_token * res.num_output_tokens


# -- results: kept per device, driver, model and drafter ------------------------------------------


def model_label(folder: str | Path) -> str:
    """A readable name for a model folder: the Hub id of a cached snapshot, `demo-target` for the
    demo pair's generic folder names, else the folder's name."""
    p = Path(folder).expanduser().resolve()
    for part in p.parts:
        if part.startswith("models--") and part.count("--") >= 2:
            return "/".join(part.split("--")[1:])
    if p.name in ("target", "drafter", "draft", "model") and p.parent.name:
        return f"{p.parent.name}-{p.name}"
    return p.name


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")[:60] or "x"


def results_key(device_name: str, driver: str, model: str, drafter: str) -> str:
    return "__".join(_slug(part) for part in (device_name, driver, model, drafter))


def _compact(report: dict) -> dict:
    """The report as a results file keeps it: no per-prompt token ids."""
    out = {k: v for k, v in report.items() if k not in ("categories",)}
    out["modes"] = [{k: v for k, v in m.items() if k != "per_prompt"} for m in report["modes"]]
    return out


def save_run(report: dict, folder: Path) -> tuple[Path, int]:
    """Append this run to its results file (newest last, the last KEPT_RUNS); return (file, runs)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{report['results_key']}.json"
    data = None
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data.get("runs"), list):
                raise ValueError("no list of runs")
        except (ValueError, AttributeError) as exc:
            aside = path.with_suffix(".json.bad")
            os.replace(path, aside)
            print(f"flashdesk bench: {path} was unreadable ({exc}); kept as {aside.name}, starting afresh",
                  file=sys.stderr)
            data = None
    if data is None:
        data = {"device": report["device_name"], "driver": report["driver"], "model": report["model_name"],
                "drafter": report["draft_name"], "runs": []}
    data["runs"] = (data["runs"] + [_compact(report)])[-KEPT_RUNS:]
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)
    return path, len(data["runs"])


def history(folder: Path) -> list[dict]:
    """Every results file in `folder`: its key and a line per run."""
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            runs = data["runs"]
        except (ValueError, KeyError, TypeError, OSError):
            continue
        rows = []
        for run in runs:
            modes = run.get("modes", [])
            spec = [m for m in modes if m.get("draft_length") not in (0, None) and m.get("speedup_over_ar")]
            best = max(spec, key=lambda m: m["speedup_over_ar"], default=None)
            rows.append({"date": run.get("date"), "prompts": run.get("prompts"), "tasks": run.get("tasks"),
                         "max_new_tokens": run.get("max_new_tokens"),
                         "ar_tokens_per_second": modes[0].get("tokens_per_second") if modes else None,
                         "best_mode": best and best["mode"], "best_speedup": best and best["speedup_over_ar"]})
        out.append({"file": str(path), "device": data.get("device"), "driver": data.get("driver"),
                    "model": data.get("model"), "drafter": data.get("drafter"), "runs": rows})
    return out


def format_history(files: list[dict], folder: Path) -> str:
    if not files:
        return f"no bench results yet in {folder}"
    lines = []
    for f in files:
        lines.append(f"{f['device']} ({f['driver']}): {f['model']} + {f['drafter']}")
        lines.append(f"  {f['file']}")
        for r in f["runs"]:
            best = f"{r['best_mode']} {r['best_speedup']:.2f}x" if r["best_mode"] else "-"
            ar = f"{r['ar_tokens_per_second']:.1f}" if r["ar_tokens_per_second"] else "-"
            lines.append(f"  {r['date'] or '?':<20}{r['prompts'] or 0:>4} prompts x {r['max_new_tokens'] or 0:<5}"
                         f" AR {ar:>8} tok/s   best {best}")
    return "\n".join(lines)


# -- the chart ---------------------------------------------------------------------------------


def write_chart(report: dict, path: Path) -> None:
    """Grouped bars: speedup over AR by task type (and over all), one bar per DFlash mode, a line at
    1.0 (AR). matplotlib is imported here only, and drawn off screen (Agg), never through pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    modes = [m for m in report["modes"] if m["draft_length"] != 0]
    groups = list(report["tasks"]) + ["all"]
    fig = Figure(figsize=(min(16.0, max(8.0, 1.5 + 0.4 * len(groups) * max(1, len(modes)))), 5.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(1, len(modes))
    fixed = [m for m in modes if m["draft_length"] != AUTO]
    for j, m in enumerate(modes):
        values = [(m["by_task"].get(g, {}).get("speedup_over_ar") if g != "all" else m["speedup_over_ar"]) or 0.0
                  for g in groups]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(groups))]
        if m["draft_length"] == AUTO:
            color = "#d95f02"
        else:
            shade = fixed.index(m) / max(1, len(fixed) - 1) if len(fixed) > 1 else 0.5
            color = (0.35 - 0.25 * shade, 0.55 - 0.25 * shade, 0.85 - 0.25 * shade)
        bars = ax.bar(xs, values, width * 0.95, label=m["mode"], color=color)
        if len(modes) * len(groups) <= 40:
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="AR (1.0)")
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("decode speedup over AR")
    ax.set_ylim(0, max([1.2] + [1.15 * (m["speedup_over_ar"] or 0) for m in modes] +
                       [1.15 * (c.get("speedup_over_ar") or 0) for m in modes for c in m["by_task"].values()]))
    ax.legend(fontsize=8, ncol=min(len(modes) + 1, 6), loc="upper left")
    ax.set_title(f"FlashDesk bench: {report['model_name']} + {report['draft_name']}\n"
                 f"{report['device_name']} ({report['driver']}), "
                 f"{report['prompts']} prompts x up to {report['max_new_tokens']} tokens, {report['date']}",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")


# -- the run -----------------------------------------------------------------------------------


def _progress(total: int, quiet: bool):
    """A progress bar on stderr (stdout stays for the report or the one JSON object)."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with huggingface-hub
        return None
    return tqdm(total=total, desc="bench", unit="run", file=sys.stderr, mininterval=0.5, disable=quiet,
                dynamic_ncols=True, leave=True)


def run_bench(args) -> int:
    if getattr(args, "history", False):
        files = history(paths.bench_dir())
        print(json.dumps(files) if args.json else format_history(files, paths.bench_dir()))
        return 0
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    per_task = args.prompts_per_task
    if per_task is not None and per_task < 1:
        raise ValueError(f"--prompts-per-task must be at least 1, got {per_task}")
    lengths = parse_draft_lengths(args.draft_lengths)
    if args.prompts:  # your own file: its task types; all its prompts unless --prompts-per-task says
        items = load_prompts(args.prompts)
        known = list(dict.fromkeys(p["task"] for p in items))
        tasks = parse_tasks(args.tasks, known)
    else:
        tasks = parse_tasks(args.tasks, list(TASKS))
        items = [p for t in tasks for p in task_prompts(t)]
        if per_task is None and not args.full:
            per_task = DEFAULT_PROMPTS_PER_TASK
    items = select_prompts(items, tasks, per_task)
    if args.demo:
        from flashdesk.engine.hub.demo import create_demo

        args.model, args.draft = (str(p) for p in create_demo(paths.demo_dir()))

    engine = Engine.load(args.model, args.device, args.dtype, args.kv_dtype, None, args.draft,
                         draft_quantize=getattr(args, "draft_quantize", None))
    if engine.tokenizer is None:
        raise FlashDeskError(f"{args.model} has no tokenizer: bench needs one to apply the chat template")
    longest = engine.drafter.max_draft_length
    bad = [k for k in lengths if k != AUTO and not 1 <= k <= longest]
    if bad:
        raise ValueError(f"--draft-lengths: {bad[0]} is outside 1..{longest} for this drafter")
    prompts = [build_prompt_ids(engine.tokenizer, messages_from(p["prompt"]), enable_thinking=False)
               for p in items]
    modes = [ModeResult(mode_name(k), k) for k in [0, *lengths]]
    device = DeviceProbe(engine.model.device)
    try:
        runs = [(m, lambda ids, task, m: run_ours(engine, ids, task, args.max_new_tokens, m, device.energy_mj))
                for m in modes]
        references: list[RefResult] = []
        if args.compare:
            target, drafter = reference_models(args.model, args.draft, engine.model.device, engine.model.dtype)
            if engine.model.device.type != "cuda":
                import dflash.model as dflash_model

                dflash_model._cuda_time = time.perf_counter  # its timer calls torch.cuda.synchronize
            stop = sorted(engine.eos)
            fixed = [k for k in lengths if k != AUTO]  # z-lab's loop has no automatic draft length
            references = [RefResult("transformers generate (AR)", 0)] + [
                RefResult(f"z-lab dflash_generate K={k}", k) for k in fixed]
            runs.append((references[0],
                         lambda ids, task, m: run_transformers(target, ids, args.max_new_tokens, stop, m)))
            runs += [(m, lambda ids, task, m: run_reference(target, drafter, ids, args.max_new_tokens, stop, m))
                     for m in references[1:]]
        bar = _progress(len(runs) * (len(prompts) + 1), quiet=getattr(args, "no_progress", False))
        # warm-up into throwaway results: first-call costs (and the automatic mode's one-off
        # measurement of the step costs) stay out of the numbers
        for result, run in runs:
            if bar is not None:
                bar.set_postfix_str(f"warm-up | {result.name}", refresh=False)
            throwaway = ModeResult(result.name, result.draft_length) if isinstance(result, ModeResult) \
                else RefResult(result.name, result.draft_length)
            run(prompts[0][:8], "warm-up", throwaway)
            if bar is not None:
                bar.update()
        # every mode on one prompt before the next: drift in machine load hits all alike; the order of
        # the modes turns by one each prompt, so none always runs first after a new prompt
        for i, (ids, item) in enumerate(zip(prompts, items)):
            shift = i % len(runs)
            for result, run in runs[shift:] + runs[:shift]:
                if bar is not None:
                    bar.set_postfix_str(f"{item['task']} {i + 1}/{len(prompts)} | {result.name}", refresh=False)
                run(ids, item["task"], result)
                if bar is not None:
                    bar.update()
        if bar is not None:
            bar.close()
    finally:
        device.close()

    ar = modes[0]
    now = datetime.datetime.now().astimezone()
    report = {
        "model": str(args.model), "draft": str(args.draft), "prompts": len(prompts),
        "categories": [p["task"] for p in items], "max_new_tokens": args.max_new_tokens,
        "device": str(engine.model.device), "dtype": str(engine.model.dtype).removeprefix("torch."),
        "kv_dtype": engine.kv_dtype, "modes": [m.as_dict(ar) for m in modes],
    }
    report["outputs_identical"] = all(m.per_prompt[i]["token_ids"] == ar.per_prompt[i]["token_ids"]
                                      for m in modes for i in range(len(prompts)))
    if references:
        ours = {m.draft_length: m.tokens_per_second for m in modes}
        report["compare"] = {
            ("transformers_ar" if i == 0 else f"zlab_dflash_k{m.draft_length}"):
                {"tokens_per_second": m.tokens_per_second, "ours_over_it": ours[m.draft_length] / m.tokens_per_second}
            for i, m in enumerate(references)}
    report.update({
        "tasks": tasks, "prompts_per_task": per_task, "draft_lengths": lengths, "prefix_reuse": False,
        "date": now.isoformat(timespec="seconds"), "device_name": device.name, "driver": device.driver,
        "energy": device.energy_note, "model_name": model_label(args.model), "draft_name": model_label(args.draft),
        "torch": torch.__version__,
    })
    report["results_key"] = key = results_key(device.name, device.driver, report["model_name"], report["draft_name"])
    chart = Path(args.chart).expanduser() if args.chart else paths.bench_dir() / f"{key}.png"
    try:
        write_chart(report, chart)
        report["chart"] = str(chart)
    except ImportError:
        report["chart"] = None
        print("flashdesk bench: no chart: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
    results, count = save_run(report, paths.bench_dir())
    report["results_file"], report["results_runs"] = str(results), count
    print(json.dumps(report) if args.json else format_report(report))
    return 0


# -- the text report ---------------------------------------------------------------------------


def _fmt(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _row(task: str, name: str, c: dict) -> str:
    ttft = None if c.get("ttft_seconds") is None else c["ttft_seconds"] * 1000.0
    speedup = _fmt(c["speedup_over_ar"], ".2f") + ("x" if c["speedup_over_ar"] is not None else "")
    return (f"{task:<15}{name:<14}{c['tokens_per_second']:>9.1f}{speedup:>9}{_fmt(ttft, '.1f'):>10}"
            f"{_fmt(c['mean_acceptance_length'], '.2f'):>7}{_fmt(c['acceptance_rate'], '.0%'):>8}"
            f"{_fmt(c.get('mean_draft_length'), '.1f'):>7}{_fmt(c.get('joules_per_token'), '.3f', 'n/a'):>9}")


def format_report(report: dict) -> str:
    """Per task type x mode: decode tok/s, speedup over AR, TTFT, tau, acceptance, mean K, J/token;
    then acceptance by draft position per mode (all tasks); 100 columns at most."""
    tasks = report.get("tasks") or list(dict.fromkeys(report.get("categories", [])))
    per_task = report.get("prompts_per_task")
    shape = f" ({len(tasks)} task types x {per_task})" if per_task and tasks else ""
    lines = [f"FlashDesk bench: {report['prompts']} prompts{shape} x up to {report['max_new_tokens']} new tokens, "
             "greedy, modes interleaved",
             f"device: {report.get('device_name', report['device'])} ({report.get('driver', '?')}), "
             f"{report['dtype']}, KV {report['kv_dtype']}; energy: {report.get('energy', 'n/a')}"]
    if report.get("model_name"):
        lines.append(f"models: {report['model_name']} + {report['draft_name']}")
    lines += ["", f"{'task':<15}{'mode':<14}{'tok/s':>9}{'speedup':>9}{'TTFT ms':>10}{'tau':>7}{'accept':>8}"
              f"{'K':>7}{'J/token':>9}"]
    for task in tasks:
        for j, m in enumerate(report["modes"]):
            if task in m.get("by_task", {}):
                lines.append(_row(task if j == 0 else "", m["mode"], m["by_task"][task]))
    for j, m in enumerate(report["modes"]):
        lines.append(_row("all tasks" if j == 0 else "", m["mode"], m))
    spec = [m for m in report["modes"] if m.get("acceptance_by_position")]
    if spec:
        lines += ["", "acceptance by draft position (1, 2, ...), all tasks:"]
        for m in spec:
            lines.append(f"{m['mode']:<15}" + "".join(f"{p:>5.0%}" for p in m["acceptance_by_position"][:16]))
    lines.append("")
    lines.append("outputs identical across modes: " + ("yes" if report["outputs_identical"] else
                                                       "NO (speculation changed the output: a bug)"))
    for name, c in report.get("compare", {}).items():
        label = "transformers generate (AR)" if name == "transformers_ar" else \
            f"z-lab dflash_generate K={name.removeprefix('zlab_dflash_k')}"
        lines.append(f"{label:<34}{c['tokens_per_second']:>10.1f} tok/s   ours / it = {c['ours_over_it']:.2f}x")
    if report.get("results_file"):
        lines.append(f"results: {report['results_file']} (run {report['results_runs']})")
    if report.get("chart"):
        lines.append(f"chart:   {report['chart']}")
    return "\n".join(lines)
