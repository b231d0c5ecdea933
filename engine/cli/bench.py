"""`flashdesk bench`: AR against DFlash and MTP (several draft lengths, and automatic) by task type,
in one interleaved run.

The measuring lives in engine/bench/ (the app's Benchmark page runs the same through the worker);
this is the command line around it: arguments, a progress bar on stderr, the report or one JSON
object on stdout, `--history`. Per cell (task type x mode): decode tok/s, time to first token, tau,
acceptance rate and by position, the mean draft length, and joules per decoded token on a GPU.
Results are kept per (device, driver, model, drafter) in the data folder with a PNG chart.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flashdesk import paths
from flashdesk.engine.bench.measure import BenchPlan, keep_run, run_suite
from flashdesk.engine.bench.prompts import (
    DEFAULT_PROMPTS_PER_TASK,
    TASKS,
    load_prompts,
    parse_draft_lengths,
    parse_methods,
    parse_tasks,
    select_prompts,
    task_prompts,
)
from flashdesk.engine.bench.report import format_history, format_report
from flashdesk.engine.bench.results import history
from flashdesk.engine.decode.generation import Engine


def _progress_bar(quiet: bool):
    """A progress callback drawing a bar on stderr (stdout stays for the report or the JSON), and
    its closer; (None, no-op) when quiet or without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with huggingface-hub
        return None, lambda: None
    if quiet:
        return None, lambda: None
    bar = tqdm(total=1, desc="bench", unit="run", file=sys.stderr, mininterval=0.5, dynamic_ncols=True, leave=True)

    def update(done: int, total: int, what: str) -> None:
        bar.total = total
        bar.set_postfix_str(what, refresh=False)
        bar.update(done - bar.n)

    return update, bar.close


def plan_from_args(args) -> BenchPlan:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    per_task = args.prompts_per_task
    if per_task is not None and per_task < 1:
        raise ValueError(f"--prompts-per-task must be at least 1, got {per_task}")
    lengths = parse_draft_lengths(args.draft_lengths)
    if args.prompts:  # your own file: its task types; all its prompts unless --prompts-per-task says
        items = load_prompts(args.prompts)
        tasks = parse_tasks(args.tasks, list(dict.fromkeys(p["task"] for p in items)))
    else:
        tasks = parse_tasks(args.tasks, list(TASKS))
        items = [p for t in tasks for p in task_prompts(t)]
        if per_task is None and not args.full:
            per_task = DEFAULT_PROMPTS_PER_TASK
    items = select_prompts(items, tasks, per_task)
    if args.compare:  # transformers' generate and z-lab's loop know no grammar: their times would not compare
        if args.tasks is not None and any(p.get("schema") for p in items):
            raise ValueError("--compare times references that know no grammar: leave prompts with a schema out")
        items = [p for p in items if not p.get("schema")]
        tasks = [t for t in tasks if any(p["task"] == t for p in items)]
    return BenchPlan(items, tasks, lengths, args.max_new_tokens, per_task, bool(args.compare))


def run_bench(args) -> int:
    if getattr(args, "history", False):
        files = history(paths.bench_dir())
        print(json.dumps(files) if args.json else format_history(files, paths.bench_dir()))
        return 0
    plan = plan_from_args(args)
    if args.demo:
        from flashdesk.engine.hub.demo import demo_pair

        args.model, args.draft = demo_pair()
    engine = Engine.load(
        args.model,
        args.device,
        args.dtype,
        args.kv_dtype,
        None,
        args.draft,
        draft_quantize=getattr(args, "draft_quantize", "auto"),
        assistant_dir=getattr(args, "assistant", None),
    )
    plan.methods = parse_methods(getattr(args, "methods", None), list(engine.methods))
    if engine.fallback_note():  # the bench then measures torch kernels: say so
        print(f"flashdesk: {engine.fallback_note()}", file=sys.stderr, flush=True)
    progress, close = _progress_bar(getattr(args, "no_progress", False))
    try:
        report = run_suite(engine, plan, args.model, args.draft, progress)
    finally:
        close()
    keep_run(report, paths.bench_dir(), Path(args.chart).expanduser() if args.chart else None)
    if report["chart"] is None:
        print("flashdesk bench: no chart: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
    print(json.dumps(report) if args.json else format_report(report))
    return 0
