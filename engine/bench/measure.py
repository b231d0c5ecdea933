"""Running the modes: every mode decodes the same prompts with the same settings in one process,
one prompt in every mode back to back before the next prompt (interleaved), so drift in the
machine's load or clocks hits all modes alike and the ratios compare like with like. Every request
prefills from scratch (no prefix reuse), so each mode's time to first token is measured the same way.

Prompts with a JSON schema (the "json" task type) decode under its grammar, and each mode's cells
report the grammar's share of their decode time (host time in the masks, GrammarState.seconds).

`run_suite` is the whole run, with a progress callback and a stop check between engine steps:
`flashdesk bench` draws a progress bar with it, the worker reports BenchProgress and honours Cancel.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from flashdesk.engine.bench.device import DeviceProbe
from flashdesk.engine.bench.prompts import AUTO, mode_name, parse_methods
from flashdesk.engine.bench.chart import write_chart
from flashdesk.engine.bench.results import best_draft_length, best_mode, model_label, results_key, save_run
from flashdesk.engine.decode.chat_format import build_prompt_ids, messages_from
from flashdesk.engine.decode.generation import Engine, FinishEvent, GenerationRequest
from flashdesk.engine.decode.grammar import Grammar, check, json_grammar
from flashdesk.engine.decode.speculative import SpecControl
from flashdesk.engine.decode.stats import SpecStats, StepRecord
from flashdesk.engine.errors import FlashDeskError


@dataclass
class Cell:
    """One task type in one mode (or one mode over all task types): sums over its prompts."""

    stats: SpecStats = field(default_factory=SpecStats)
    prompts: int = 0
    prefill_seconds: float = 0.0
    energy_mj: float | None = 0.0  # None once a reading is missing
    grammar_seconds: float = 0.0  # host time in grammar masks, over the prompts held to a schema
    grammar_decode_seconds: float = 0.0  # those prompts' decode time

    def as_dict(self, baseline: float | None) -> dict:
        s = self.stats.summary()
        tps = s["decode_tokens_per_second"]
        joules = self.energy_mj / 1000.0 if self.energy_mj is not None else None
        return {
            "prompts": self.prompts,
            "decode_tokens": s["decode_tokens"],
            "decode_seconds": s["decode_seconds"],
            "tokens_per_second": tps,
            "speedup_over_ar": tps / baseline if baseline else None,
            "ttft_seconds": self.prefill_seconds / self.prompts if self.prompts else None,
            "acceptance_rate": s["acceptance_rate"],
            "mean_acceptance_length": s["mean_acceptance_length"],
            "acceptance_by_position": s["per_position_acceptance"],
            "accepted_histogram": s["accepted_histogram"],
            "steps": s["steps"],
            "speculative_steps": s["speculative_steps"],
            "mean_draft_length": s["drafted"] / s["speculative_steps"] if s["speculative_steps"] else None,
            "tokens_per_step": s["decode_tokens"] / s["steps"] if s["steps"] else None,
            "energy_joules": joules,
            "joules_per_token": joules / s["decode_tokens"] if joules is not None and s["decode_tokens"] else None,
            "grammar_share": (
                self.grammar_seconds / self.grammar_decode_seconds if self.grammar_decode_seconds > 0 else None
            ),
        }


@dataclass
class ModeResult:
    """One of our modes: AR (draft length 0), a method (DFlash, MTP) at a fixed K or auto, or the
    automatic method; per task and in all."""

    name: str
    draft_length: int | str = 0
    total: Cell = field(default_factory=Cell)
    cells: dict = field(default_factory=dict)  # task type -> Cell
    per_prompt: list = field(default_factory=list)
    method: str | None = None  # "dflash", "mtp", AUTO; None for AR

    def control(self) -> SpecControl:
        return SpecControl(self.draft_length != 0, self.draft_length or None, self.method)

    @property
    def tokens_per_second(self) -> float:
        return self.total.stats.summary()["decode_tokens_per_second"]

    def as_dict(self, baseline: "ModeResult | None") -> dict:
        """Today's fields (mode, draft_length, decode_tokens, ... per_prompt), the per-cell statistics
        over all prompts, and `by_task`: the same per task type, speedup against AR's on that type."""
        out: dict[str, Any] = {"mode": self.name, "draft_length": self.draft_length, "method": self.method}
        out.update(self.total.as_dict(baseline.tokens_per_second if baseline else None))
        out["per_prompt"] = self.per_prompt
        out["by_task"] = {
            task: cell.as_dict(
                baseline.cells[task].stats.summary()["decode_tokens_per_second"]
                if baseline and task in baseline.cells
                else None
            )
            for task, cell in self.cells.items()
        }
        return out


class BenchCancelled(Exception):
    """The run was stopped between two engine steps (the app's Cancel)."""


def run_ours(
    engine: Engine,
    ids: list[int],
    task: str,
    max_new: int,
    result: ModeResult,
    energy=lambda: None,
    should_stop: Callable[[], bool] = lambda: False,
    grammar: Grammar | None = None,
) -> list[int]:
    """Decode one prompt greedily in one mode (under `grammar` when given), from a cold prefill; add
    its steps to the mode's cell for `task` and to its total. Energy is read after the prefill and
    at the end: decode only."""
    cell = result.cells.setdefault(task, Cell())
    start = finish = None
    records = []
    events = engine.generate(GenerationRequest(ids, max_new, reuse=False, grammar=grammar), result.control())
    try:
        for event in events:
            if isinstance(event, FinishEvent):
                finish = event
            elif event.index == 0:
                start = energy()
            else:
                records.append(
                    StepRecord(
                        tuple(event.draft),
                        event.accepted,
                        tuple(event.emitted),
                        event.draft_seconds,
                        event.verify_seconds,
                        event.method,
                    )
                )
            if should_stop():
                raise BenchCancelled()
    finally:
        events.close()  # the engine settles its cache
    if finish is None:
        raise FlashDeskError("the engine's generation ended without its finish event")
    end = energy()
    joules = end - start if start is not None and end is not None else None
    s = finish.stats
    decode_seconds = sum(r.draft_seconds + r.verify_seconds for r in records)
    for c in (cell, result.total):
        for record in records:
            c.stats.add(record)
        if s.get("grammar_seconds") is not None:
            c.grammar_seconds += s["grammar_seconds"]
            c.grammar_decode_seconds += decode_seconds
        c.prompts += 1
        c.prefill_seconds += s["prefill_seconds"]
        c.energy_mj = c.energy_mj + joules if c.energy_mj is not None and joules is not None else None
    result.per_prompt.append(
        {
            "task": task,
            "tokens": len(finish.token_ids),
            "ttft_seconds": s["prefill_seconds"],
            "decode_tokens_per_second": s["decode_tokens_per_second"],
            "acceptance_rate": s["acceptance_rate"],
            "token_ids": finish.token_ids,
        }
    )
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
    drafter.config.dflash_config = dict(
        getattr(drafter.config, "dflash_config", {}) or {}, input_embedding_scale=math.sqrt(drafter.config.hidden_size)
    )
    return target, drafter


def run_transformers(target, ids: list[int], max_new: int, stop: list[int], result: RefResult) -> None:
    """transformers' greedy generate: decode time = the whole call minus a 1-token call (the prefill).
    It knows no grammar: a prompt with a schema decodes freely (as in z-lab's loop)."""
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

    res = dflash_model.dflash_generate(
        drafter,
        target,
        torch.tensor([ids], device=target.device),
        max_new,
        stop,
        block_size=result.draft_length + 1,
        return_stats=True,
    )
    result.decode_tokens += res.num_output_tokens - 1
    result.decode_seconds += res.time_per_output_token * res.num_output_tokens


# -- the whole run -------------------------------------------------------------------------------


@dataclass
class BenchPlan:
    """What to run: the prompts ({"prompt", "task"}, in running order), the task types, the draft
    lengths (and auto; AR always runs) of each method (None: every loaded one, and the automatic
    method with two), the reply length, and whether to time the references."""

    items: list[dict]
    tasks: list[str]
    draft_lengths: list[int | str]
    max_new_tokens: int = 128
    prompts_per_task: int | None = None
    compare: bool = False
    methods: list[str] | None = None


def check_draft_lengths(engine: Engine, lengths: list[int | str]) -> None:
    if engine.method is None:
        raise FlashDeskError("the bench compares AR with speculation: load a draft model with the model")
    for method, drafts in engine.methods.items():
        longest = drafts.max_draft_length
        bad = [k for k in lengths if k != AUTO and (not isinstance(k, int) or not 1 <= k <= longest)]
        if bad:
            raise ValueError(f"--draft-lengths: {bad[0]} is outside 1..{longest} for the {method} draft model")


def plan_modes(engine: Engine, plan: BenchPlan) -> list[ModeResult]:
    """AR, then each method at each draft length (the automatic method once)."""
    modes = [ModeResult(mode_name(0), 0)]
    for method in plan.methods or parse_methods(None, list(engine.methods)):
        lengths = [AUTO] if method == AUTO else plan.draft_lengths
        modes += [ModeResult(mode_name(k, method), k, method=method) for k in lengths]
    return modes


def run_suite(
    engine: Engine,
    plan: BenchPlan,
    model_dir: str | Path,
    draft_dir: str | Path,
    progress: Callable[[int, int, str], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> dict:
    """Warm every mode up, then run every prompt in every mode (the order of the modes turns by one
    each prompt); the report of the run. `progress(done, total, what)` follows the runs;
    `should_stop()` is asked after every engine step and ends the run with BenchCancelled."""
    if engine.tokenizer is None:
        raise FlashDeskError(f"{model_dir} has no tokenizer: bench needs one to apply the chat template")
    check_draft_lengths(engine, plan.draft_lengths)
    prompts = [
        build_prompt_ids(engine.tokenizer, messages_from(p["prompt"]), enable_thinking=False) for p in plan.items
    ]
    grammars = [_grammar(p) for p in plan.items]
    modes = plan_modes(engine, plan)
    device = DeviceProbe(engine.model.device)
    max_new = plan.max_new_tokens
    try:
        runs = [
            (m, lambda ids, task, m, g: run_ours(engine, ids, task, max_new, m, device.energy_mj, should_stop, g))
            for m in modes
        ]
        references: list[RefResult] = []
        if plan.compare:
            references, more = _reference_runs(engine, plan, model_dir, draft_dir)
            runs += more
        total, done = len(runs) * (len(prompts) + 1), 0

        def tick(what: str) -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, total, what)

        # warm-up into throwaway results: first-call costs (and the automatic mode's one-off
        # measurement of the step costs) stay out of the numbers
        for result, run in runs:
            throwaway = (
                ModeResult(result.name, result.draft_length, method=result.method)
                if isinstance(result, ModeResult)
                else RefResult(result.name, result.draft_length)
            )
            run(prompts[0][:8], "warm-up", throwaway, None)
            tick(f"warm-up | {result.name}")
        # every mode on one prompt before the next: drift in machine load hits all alike; the order of
        # the modes turns by one each prompt, so none always runs first after a new prompt
        for i, (ids, grammar, item) in enumerate(zip(prompts, grammars, plan.items)):
            shift = i % len(runs)
            for result, run in runs[shift:] + runs[:shift]:
                run(ids, item["task"], result, grammar)
                tick(f"{item['task']} {i + 1}/{len(prompts)} | {result.name}")
    finally:
        device.close()
    return _report(engine, plan, model_dir, draft_dir, modes, references, device)


def _grammar(item: dict) -> Grammar | None:
    """A prompt's schema as its grammar (a FlashDeskError naming the prompt when it cannot be used)."""
    if item.get("schema") is None:
        return None
    grammar = json_grammar(item["schema"])
    problem = check(grammar)
    if problem:
        raise FlashDeskError(f"the schema of the prompt {item['prompt'][:40]!r} cannot be used: {problem}")
    return grammar


def _reference_runs(engine: Engine, plan: BenchPlan, model_dir, draft_dir):
    """transformers' generate and z-lab's loop at each fixed draft length, as runs beside ours."""
    if engine.drafter is None:
        raise FlashDeskError("--compare times z-lab's DFlash loop: it needs a DFlash drafter as --draft")
    target, drafter = reference_models(model_dir, draft_dir, engine.model.device, engine.model.dtype)
    if engine.model.device.type != "cuda":
        import dflash.model as dflash_model

        dflash_model._cuda_time = time.perf_counter  # its timer calls torch.cuda.synchronize
    stop, max_new = sorted(engine.eos), plan.max_new_tokens
    fixed = [k for k in plan.draft_lengths if isinstance(k, int)]  # z-lab's loop has no automatic draft length
    references = [RefResult("transformers generate (AR)", 0)] + [
        RefResult(f"z-lab dflash_generate K={k}", k) for k in fixed
    ]
    runs = [(references[0], lambda ids, task, m, g: run_transformers(target, ids, max_new, stop, m))]
    runs += [(m, lambda ids, task, m, g: run_reference(target, drafter, ids, max_new, stop, m)) for m in references[1:]]
    return references, runs


def _report(
    engine: Engine,
    plan: BenchPlan,
    model_dir,
    draft_dir,
    modes: list[ModeResult],
    references: list[RefResult],
    device: DeviceProbe,
) -> dict:
    ar = modes[0]
    n = len(plan.items)
    report: dict[str, Any] = {
        "model": str(model_dir),
        "draft": str(draft_dir),
        "prompts": n,
        "categories": [p["task"] for p in plan.items],
        "max_new_tokens": plan.max_new_tokens,
        "device": str(engine.model.device),
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "kv_dtype": engine.kv_dtype,
        "modes": [m.as_dict(ar) for m in modes],
        "method": engine.method,  # the default method, whose best mode becomes the default draft length
        "methods": list(engine.methods),
    }
    report["outputs_identical"] = all(
        m.per_prompt[i]["token_ids"] == ar.per_prompt[i]["token_ids"] for m in modes for i in range(n)
    )
    if references:
        ours = {m.draft_length: m.tokens_per_second for m in modes if m.method in (None, "dflash")}
        report["compare"] = {
            ("transformers_ar" if i == 0 else f"zlab_dflash_k{m.draft_length}"): {
                "tokens_per_second": m.tokens_per_second,
                "ours_over_it": ours[m.draft_length] / m.tokens_per_second,
            }
            for i, m in enumerate(references)
        }
    report.update(
        {
            "tasks": plan.tasks,
            "prompts_per_task": plan.prompts_per_task,
            "draft_lengths": plan.draft_lengths,
            "prefix_reuse": False,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "device_name": device.name,
            "driver": device.driver,
            "energy": device.energy_note,
            "model_name": model_label(model_dir),
            "draft_name": model_label(draft_dir),
            "torch": torch.__version__,
        }
    )
    report["results_key"] = results_key(device.name, device.driver, report["model_name"], report["draft_name"])
    report["best_draft_length"] = best_draft_length(report)
    report["best_mode"] = best_mode(report)
    return report


def keep_run(report: dict, folder: Path, chart: Path | None = None) -> dict:
    """Write the chart (default: beside the results, KEY.png) and append the run to its results file;
    the report with `chart` (None without matplotlib), `results_file` and `results_runs`."""
    chart = chart or folder / f"{report['results_key']}.png"
    try:
        write_chart(report, chart)
        report["chart"] = str(chart)
    except ImportError:
        report["chart"] = None
    results, count = save_run(report, folder)
    report["results_file"], report["results_runs"] = str(results), count
    return report
