"""The engine process: reads requests on stdin, writes events on stdout, one JSON line each.

Why a separate process: a CUDA out-of-memory, a driver fault or a kill must not take the window
and the conversation with it; the app watches this process and can start a new one.

    python -m flashdesk.engine.worker

Threads: the main thread runs one request at a time (load, generate, inspect, ...); a reader
thread takes `Cancel` and `SetSpeculation` as they arrive, so a running generation stops after the
step in flight and picks up speculation changes from its next step (the decode loop reads the
shared `SpecControl` at every step). The reader also answers `CountTokens` itself (the message
box's gauge must not wait behind a generation): with no model loaded, or while one loads, it
answers TokenCount(tokens=-1, context_limit=0), and it answers -1 when the count fails, since the
gauge is informative only. Everything else is queued in order. End of input (the app went away)
stops the worker. The message types live in `flashdesk.protocol`.

StartServer serves the loaded engine over HTTP (engine/serve/, as `flashdesk serve`): uvicorn runs
on a thread of its own, and each HTTP chat job is put on this same request queue, so HTTP requests
and the app's generations take turns on the main thread. StopServer acts at once from the reader
(queued jobs get a 503, a running one stops after its step) and again in turn, so a StartServer sent
before it cannot outlive it; Load, Unload and Shutdown stop the server first.

A Generate fits the conversation into the context first (engine/decode/conversation.py): under the
"drop_oldest" policy the oldest turns are left out of the prompt (Started.dropped_messages says how
many), under "stop" the turn is refused with a ContextOverflowError (an Error of kind bad_input);
the reply's limit is capped to the room the context leaves (Started.max_tokens), and a reply that
stopped there finishes with reason "context". The engine reuses the cached prefix that the prompt
shares with earlier turns (Started.reused_tokens; Generate.reuse=False prefills from scratch).

The real stdout is kept for the protocol only; fd 1 is pointed at stderr so that anything a
library prints cannot corrupt the stream.

Testing aid: FLASHDESK_WORKER_STEP_DELAY (seconds) sleeps after every step, so tests and
screenshots can act in the middle of a generation of the tiny demo model.
"""

from __future__ import annotations

import copy
import gc
import logging
import os
import queue
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Any, Callable

from flashdesk import protocol as p
from flashdesk.paths import HUB_CACHE_ENV
from flashdesk.engine.loading.model_card import model_name, sampling_defaults
from flashdesk.engine.cli.report import log_error, record_load

log = logging.getLogger(__name__)

PULL_HZ = 10  # PullProgress events a second at most


class PullCancelledError(Exception):
    """Raised from the download's progress callback when the app cancelled the pull."""


_HUB_CACHE_AT_START = os.environ.get(HUB_CACHE_ENV)


def use_models_folder(folder: str | None) -> None:
    """Download into, and find Hub ids in, `folder` (the app's Settings) from this request on; None:
    the folder the worker started with. Why the environment: engine/hub reads the cache from it each
    time (paths.hub_cache_dir), so every part of a survey, a download or a load agrees on it."""
    chosen = folder or _HUB_CACHE_AT_START
    if chosen:
        os.environ[HUB_CACHE_ENV] = chosen
    else:
        os.environ.pop(HUB_CACHE_ENV, None)


def error_kind(exc: BaseException) -> str:
    """What the window should call this failure: out of memory, a refused input, or a crash."""
    text = f"{type(exc).__name__} {exc}".lower()
    if isinstance(exc, MemoryError) or "out of memory" in text or "outofmemory" in text:
        return p.OUT_OF_MEMORY
    from flashdesk.engine.errors import FlashDeskError

    if isinstance(exc, (FlashDeskError, ValueError, FileNotFoundError, NotADirectoryError)):
        return p.BAD_INPUT
    return p.CRASH


class OriginTracker:
    """Which answer characters came from accepted draft tokens and which from the target.

    The engine reports each step's answer text as a whole; this runs a second channel splitter
    token by token over the same ids (the same algorithm, so the same text) and labels each
    token's text by its place in the step: the first `accepted` emitted ids were drafted, the
    last one is the target's. If the text ever disagrees, the whole delta is labelled target.
    """

    def __init__(self, tokenizer, eos: set[int]):
        from flashdesk.engine.decode.chat_format import ANSWER, ChannelSplitter

        self.answer_channel = ANSWER
        self.splitter = ChannelSplitter(tokenizer)
        self.eos = eos

    def spans(self, emitted: list[int], accepted: int, answer: str) -> list[list]:
        ids = emitted[:-1] if emitted and emitted[-1] in self.eos else emitted
        runs: list[list] = []
        for i, token in enumerate(ids):
            origin = p.DRAFT if i < accepted else p.TARGET
            for piece in self.splitter.push(token):
                if piece.channel == self.answer_channel:
                    _add_run(runs, len(piece.text), origin)
        covered = sum(n for n, _ in runs)
        if covered > len(answer):
            return [[len(answer), p.TARGET]] if answer else []
        _add_run(runs, len(answer) - covered, p.TARGET)  # the final flush
        return runs


def _add_run(runs: list[list], n: int, origin: str) -> None:
    if n <= 0:
        return
    if runs and runs[-1][1] == origin:
        runs[-1][0] += n
    else:
        runs.append([n, origin])


class Worker:
    def __init__(self, out):
        from flashdesk.engine.decode.speculative import SpecControl

        self.out = out
        self.write_lock = threading.Lock()
        self.requests: queue.Queue = queue.Queue()
        self.engine = None
        self.control = SpecControl(enabled=True, draft_length=None)
        self.stopping = threading.Event()
        self.state_lock = threading.Lock()
        self.active: str | None = None  # the request id being generated
        self.step = 0  # the index of the step the active generation is running
        self.cancels: dict[str, int | None] = {}  # request id -> the step running when cancel came
        self.step_delay = float(os.environ.get("FLASHDESK_WORKER_STEP_DELAY") or 0)
        self.pulls: dict[str, int] = {}  # repo id -> Pull requests of it queued or running
        self.pull_cancels: set[str] = set()  # repo ids whose download was cancelled (running or queued)
        self._counter = None  # (engine, a tokenizer of its own) for CountTokens on the reader thread
        self.folders: tuple[Path, Path | None] | None = None  # the loaded target's and drafter's folders
        self.serving = None  # the HTTP server on the loaded engine (engine/serve/server.py Serving), when on

    # -- I/O ------------------------------------------------------------------------------------

    def send(self, msg) -> None:
        line = p.encode(msg) + "\n"
        with self.write_lock:
            try:
                self.out.write(line)
                self.out.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.stopping.set()  # the app is gone

    def read(self, stream) -> None:
        """The reader thread: urgent requests act at once, the rest go to the queue."""
        for raw in stream:
            try:
                self._take(raw)
            except Exception as exc:  # noqa: BLE001 - no line may stop the reader (the worker would go deaf)
                self.send(p.Error(p.BAD_INPUT, str(exc) or type(exc).__name__, during="request"))
        self.stopping.set()
        self.requests.put(p.Shutdown())

    def _take(self, raw: str) -> None:
        """One line of input: urgent requests act here, the rest are queued."""
        msg = p.decode(raw)
        if isinstance(msg, p.Cancel):
            with self.state_lock:
                self.cancels[msg.request_id] = self.step if self.active == msg.request_id else None
        elif isinstance(msg, p.SetSpeculation):
            self.set_speculation(msg)
        elif isinstance(msg, p.CountTokens):
            self.count_tokens(msg)
        elif isinstance(msg, p.StopServer):  # at once (it may be queued behind replies), and again in
            # turn, after any StartServer sent before it
            threading.Thread(target=self.stop_server, args=(True,), name="stop-server", daemon=True).start()
            self.requests.put(msg)
        elif isinstance(msg, p.CancelPull):
            with self.state_lock:
                if msg.repo_id.strip() in self.pulls:  # running or queued; otherwise nothing to stop
                    self.pull_cancels.add(msg.repo_id.strip())
        else:
            if isinstance(msg, p.Shutdown):
                self.stopping.set()
            elif isinstance(msg, p.Pull):
                with self.state_lock:
                    self.pulls[msg.repo_id.strip()] = self.pulls.get(msg.repo_id.strip(), 0) + 1
            self.requests.put(msg)

    def count_tokens(self, msg: p.CountTokens) -> None:
        """The prompt length of `msg.messages` (reader thread): -1 with no model, or when it fails."""
        with self.state_lock:
            engine = self.engine  # load and unload swap it under this lock
        if engine is None or engine.tokenizer is None:
            self.send(p.TokenCount(msg.request_id, -1, 0))
            return
        from flashdesk.engine.decode.chat_format import build_prompt_ids

        try:
            if self._counter is None or self._counter[0]() is not engine:
                # its own copy: the main thread detokenizes with the engine's while a reply runs,
                # and a fast tokenizer must not be borrowed by two threads at once (a weak reference:
                # an unloaded engine must be freed)
                self._counter = (weakref.ref(engine), copy.deepcopy(engine.tokenizer))
            tokens = len(build_prompt_ids(self._counter[1], msg.messages, enable_thinking=msg.thinking))
        except Exception as exc:  # noqa: BLE001 - the gauge is informative: say "unknown", log why
            log.warning("count_tokens failed: %s: %s", type(exc).__name__, exc)
            tokens = -1
        self.send(p.TokenCount(msg.request_id, tokens, engine.context_limit))

    def set_speculation(self, msg: p.SetSpeculation) -> None:
        from flashdesk.engine.decode.speculative import AUTO

        length = msg.draft_length
        if isinstance(length, str) and length != AUTO:
            raise ValueError(f"set_speculation: draft_length must be a whole number, {AUTO!r} or null, got {length!r}")
        if length is not None and length != AUTO:
            length = max(1, int(length))
            if self.engine is not None and self.engine.method is not None:
                length = min(length, self.engine.max_draft_length)
        if msg.method not in (None, AUTO, "dflash", "mtp"):
            raise ValueError(f"set_speculation: method must be dflash, mtp, {AUTO!r} or null, got {msg.method!r}")
        loaded = list(self.engine.methods) if self.engine is not None else None
        if loaded is not None and msg.method is not None and msg.method not in loaded + [AUTO] * (len(loaded) > 1):
            raise ValueError(
                f"set_speculation: method {msg.method!r} is not loaded (loaded: {', '.join(loaded) or 'none'})"
            )
        self.control.draft_length = length
        self.control.method = msg.method
        self.control.enabled = bool(msg.enabled)

    # -- the main loop ----------------------------------------------------------------------------

    def run(self) -> int:
        import torch

        from flashdesk.engine.serve.runner import Job

        self.send(p.Ready(pid=os.getpid(), torch=torch.__version__, cuda=bool(torch.cuda.is_available())))
        handlers: dict[type, Callable[[Any], None]] = {
            p.Load: self.load,
            p.Generate: self.generate,
            p.Inspect: self.inspect,
            p.CreateDemo: self.create_demo,
            p.Unload: self.unload,
            p.Pull: self.pull,
            p.Bench: self.bench,
            p.BenchHistory: self.bench_history,
            p.Survey: self.survey,
            p.StartServer: self.start_server,
            p.StopServer: lambda msg: self.stop_server(),
            Job: self.http_job,
        }
        while True:
            msg = self.requests.get()
            if isinstance(msg, p.Shutdown):
                self.stop_server()
                return 0
            handler = handlers.get(type(msg))
            if handler is None:
                self.send(p.Error(p.BAD_INPUT, f"the worker does not take {msg.TYPE} requests", during="request"))
                continue
            try:
                handler(msg)
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self.report(exc, msg)

    def report(self, exc: BaseException, msg) -> None:
        kind = error_kind(exc)
        during = {
            p.Load: "load",
            p.Generate: "generate",
            p.Inspect: "inspect",
            p.CreateDemo: "demo",
            p.Pull: "pull",
            p.Bench: "bench",
            p.BenchHistory: "bench",
            p.Survey: "survey",
        }.get(type(msg), "request")
        details = "" if kind == p.BAD_INPUT else traceback.format_exc()
        text = str(exc) or type(exc).__name__
        if kind == p.CRASH:
            text = f"{type(exc).__name__}: {text}"
        log_error(kind, during, text)  # for `flashdesk doctor --report`
        self.send(p.Error(kind, text, during=during, request_id=getattr(msg, "request_id", None), details=details))
        if kind == p.OUT_OF_MEMORY:
            self._free()
        if during == "load":
            self._set_engine(None)
            self._free()

    def _set_engine(self, engine) -> None:
        with self.state_lock:
            self.engine = engine

    def _free(self) -> None:
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- requests ----------------------------------------------------------------------------------

    def _resolve(self, name: str) -> Path:
        path = Path(name).expanduser()
        if path.is_dir():
            return path
        try:
            from flashdesk.engine.hub.models import resolve_model_path
        except ImportError:
            raise FileNotFoundError(f"{name}: no such model folder") from None
        return Path(resolve_model_path(name))

    def inspect(self, msg: p.Inspect) -> None:
        """The doctor's check of the target and drafter, with the memory plan of both."""
        from flashdesk.engine.loading.checkpoint import inspect_checkpoint

        from flashdesk.engine.decode.generation import resolve_device

        use_models_folder(msg.models_folder)
        target = self._resolve(msg.target)
        device = resolve_device(msg.device).type
        report = inspect_checkpoint(
            target,
            msg.context,
            self._resolve(msg.draft) if msg.draft else None,
            device=device,
            flags=False,
            assistant_dir=self._resolve(msg.assistant) if msg.assistant else None,
        )
        total = report.memory.total if report.memory else None
        context = report.memory.context if report.memory else msg.context
        self.send(p.Inspected(str(target), msg.draft, list(report.lines), list(report.problems), total, context))

    def survey(self, msg: p.Survey) -> None:
        from flashdesk.engine.hub.recommended import survey

        use_models_folder(msg.models_folder)
        found = survey(Path(msg.demo_folder) if msg.demo_folder else None)
        self.send(p.Surveyed(**found.as_dict()))

    def create_demo(self, msg: p.CreateDemo) -> None:
        from flashdesk.engine.hub.demo import create_demo

        target, draft = create_demo(msg.folder)
        self.send(p.DemoCreated(str(target), str(draft)))

    def pull(self, msg: p.Pull) -> None:
        """Download a Hub model into the cache, with PullProgress at most PULL_HZ times a second.

        Progress is the sum over the engine files of the bytes on disk (a partial weights file
        counts), out of the sum of their sizes; both are known once the small files are in and the
        weights' sizes were asked for. A CancelPull makes the next progress callback raise, which
        ends the download where it is: the weights file in flight keeps its partial bytes, and the
        next Pull continues it.
        """
        from flashdesk.engine.errors import FlashDeskError
        from flashdesk.engine.hub.models import REPO_ID, pull

        use_models_folder(msg.models_folder)
        repo_id = msg.repo_id.strip()
        files: dict[str, tuple[int, int]] = {}
        last: list[float | None] = [None]  # the first sum goes out a moment after the first report,
        # when the small files are in and every weights file has reported its size

        def totals() -> tuple[int, int]:
            return sum(d for d, _ in files.values()), sum(t for _, t in files.values())

        def cancelled() -> bool:
            with self.state_lock:
                return repo_id in self.pull_cancels or self.stopping.is_set()

        def progress(file: str, done: int, total: int) -> None:
            if cancelled():
                raise PullCancelledError(repo_id)
            files[file] = (done, max(total, done))
            now = time.monotonic()
            if last[0] is None:
                last[0] = now
            elif now - last[0] >= 1 / PULL_HZ:
                last[0] = now
                self.send(p.PullProgress(repo_id, file, *totals()))

        try:
            if not REPO_ID.fullmatch(repo_id):
                raise FlashDeskError(f"{repo_id!r} is not a Hugging Face model id (they look like org/name)")
            if cancelled():  # cancelled while it waited in the queue
                self.send(p.PullCancelled(repo_id))
                return
            self.send(p.PullProgress(repo_id, "", 0, 0))
            entry = pull(
                repo_id,
                show_progress=False,
                log=lambda s: print(s, file=sys.stderr, flush=True),
                progress=progress,
                checked=self._send_check,
            )
        except PullCancelledError:
            self.send(p.PullCancelled(repo_id, *totals()))
            return
        finally:
            with self.state_lock:
                self.pulls[repo_id] = self.pulls.get(repo_id, 1) - 1
                if self.pulls[repo_id] <= 0:
                    del self.pulls[repo_id]
                    self.pull_cancels.discard(repo_id)
        if entry.problems:
            raise FlashDeskError(
                f"{repo_id} was downloaded but is not complete: "
                + "; ".join(str(problem) for problem in entry.problems[:5])
                + ". Download it again to fetch the missing or damaged files"
            )
        done, total = totals()
        self.send(p.PullProgress(repo_id, "", max(done, total), max(done, total)))
        self.send(p.Pulled(repo_id, str(entry.path), entry.size))

    def _send_check(self, repo_id: str, snapshot: Path) -> None:
        """What the engine would make of a model being pulled, before its weights (models verify)."""
        from flashdesk.engine.hub.verify import check_snapshot

        verification = check_snapshot(repo_id, snapshot)
        self.send(p.PullChecked(repo_id, list(verification.lines), list(verification.problems)))

    def unload(self, msg: p.Unload) -> None:
        self.stop_server()
        self._set_engine(None)
        self._free()
        self.send(p.Unloaded())

    def load(self, msg: p.Load) -> None:
        import torch

        from flashdesk.engine.bench.results import benched_default
        from flashdesk.engine.errors import FlashDeskError
        from flashdesk.engine.decode.generation import Engine

        self.stop_server()
        self._set_engine(None)
        self._free()
        started = time.perf_counter()
        self.send(p.LoadProgress("resolve", 0.05, "finding the model files"))
        use_models_folder(msg.models_folder)
        target = self._resolve(msg.target)
        draft = self._resolve(msg.draft) if msg.draft else None
        assistant = self._resolve(msg.assistant) if msg.assistant else None
        drafts = " and its draft models" if draft and assistant else " and its draft model" if draft else ""
        text = f"loading {model_name(target)}{drafts}"
        self.send(p.LoadProgress("weights", 0.05, text))
        last = [0.0]

        def progress(fraction: float) -> None:  # 5%..95% of the bar follows the bytes read, ~10 Hz
            now = time.perf_counter()
            if now - last[0] >= 0.1 or fraction >= 1.0:
                last[0] = now
                self.send(p.LoadProgress("weights", 0.05 + 0.9 * fraction, text))

        engine = Engine.load(
            target,
            msg.device,
            msg.dtype,
            msg.kv_dtype,
            msg.context,
            draft,
            progress=progress,
            stage=lambda text: self.send(p.LoadProgress("kernels", -1, text)),
            draft_default=benched_default,
            assistant_dir=assistant,
        )
        if engine.tokenizer is None:
            raise FlashDeskError(
                f"{target} has no tokenizer (tokenizer.json and a chat template): "
                "the app needs one to turn messages into tokens"
            )
        self.send(p.LoadProgress("ready", 1.0, "loaded"))
        self._set_engine(engine)
        self.folders = (target, draft or assistant)  # the bench keys its runs by the draft model
        model = engine.model
        device = model.device
        uuid, device_name, memory = None, "CPU", _rss()
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            device_name = props.name
            uuid = f"GPU-{props.uuid}" if getattr(props, "uuid", None) else None
            memory = int(torch.cuda.memory_allocated(device))
        block = engine.max_draft_length + 1 if engine.method is not None else None
        record_load(_load_facts(engine, target, draft, memory))  # for `flashdesk doctor --report`
        self.send(
            p.Loaded(
                target=str(target),
                draft=str(draft) if draft else None,
                name=model_name(target),
                device=str(device),
                device_name=device_name,
                device_uuid=uuid,
                dtype=str(model.dtype).removeprefix("torch."),
                kv_dtype=engine.kv_dtype,
                context_limit=engine.context_limit,
                block_size=block,
                memory_bytes=memory,
                seconds=time.perf_counter() - started,
                layers=model.cfg.num_layers,
                vocab=model.cfg.vocab_size,
                sampling_defaults=sampling_defaults(target),
                default_draft_length=engine.default_draft_length or engine.method_draft_length,
                default_note=engine.default_note,
                kernel_note=engine.fallback_note(),
                method=engine.method,
                methods=list(engine.methods),
            )
        )

    def bench(self, msg: p.Bench) -> None:
        """`flashdesk bench` on the loaded pair: BenchProgress at most PULL_HZ times a second, the run
        kept in the data folder, then BenchResult; a Cancel stops it after the engine step in flight.
        The engine's default draft length follows the new run."""
        from flashdesk import paths
        from flashdesk.engine.bench.measure import BenchCancelled, BenchPlan, keep_run, run_suite
        from flashdesk.engine.bench.prompts import (
            TASKS,
            parse_draft_lengths,
            parse_methods,
            parse_tasks,
            select_prompts,
            task_prompts,
        )
        from flashdesk.engine.bench.results import benched_default, compact
        from flashdesk.engine.errors import FlashDeskError

        engine, rid, folders = self.engine, msg.request_id, self.folders
        if engine is None or engine.method is None or folders is None:
            raise FlashDeskError(
                "the benchmark compares plain decoding with speculation: load a model with a draft model"
            )
        if not 1 <= msg.max_new_tokens <= 4096 or not 1 <= msg.prompts_per_task <= 100:
            raise FlashDeskError("the benchmark takes 1..100 prompts per task type and 1..4096 new tokens")
        tasks = parse_tasks(",".join(msg.tasks), list(TASKS))
        lengths = parse_draft_lengths(",".join(str(k) for k in msg.draft_lengths))
        items = select_prompts([q for t in tasks for q in task_prompts(t)], tasks, msg.prompts_per_task)
        methods = parse_methods(",".join(msg.methods), list(engine.methods))
        plan = BenchPlan(items, tasks, lengths, msg.max_new_tokens, msg.prompts_per_task, methods=methods)
        last = [0.0]

        def progress(done: int, total: int, text: str) -> None:
            now = time.monotonic()
            if now - last[0] >= 1 / PULL_HZ or done == total:
                last[0] = now
                self.send(p.BenchProgress(rid, done, total, text))

        def should_stop() -> bool:
            with self.state_lock:
                return rid in self.cancels or self.stopping.is_set()

        with self.state_lock:
            self.active = rid
        try:
            if should_stop():  # cancelled while it waited in the queue
                raise BenchCancelled()
            target, draft = folders
            assert draft is not None  # a draft model is loaded (engine.method)
            report = run_suite(engine, plan, target, draft, progress, should_stop)
        except BenchCancelled:
            self.send(p.BenchResult(rid, None, cancelled=True))
            return
        finally:
            with self.state_lock:
                self.active = None
                self.cancels.pop(rid, None)
        keep_run(report, paths.bench_dir())
        engine.use_draft_default(*benched_default(engine.model.device, target, draft))
        self.send(p.BenchResult(rid, compact(report)))

    def bench_history(self, msg: p.BenchHistory) -> None:
        from flashdesk import paths
        from flashdesk.engine.bench.results import kept_runs

        self.send(p.BenchRuns(msg.request_id, kept_runs(paths.bench_dir(), p.BENCH_RUNS_SHOWN)))

    # -- the HTTP server (`flashdesk serve` on the loaded engine) -------------------------------------

    def start_server(self, msg: p.StartServer) -> None:
        """Serve the loaded engine; its HTTP jobs come back through this queue, so they take turns with
        the app's generations on this thread. Any failure is said in ServerState, not as an Error."""
        from flashdesk.engine.errors import FlashDeskError
        from flashdesk.engine.serve.auth import check_exposure
        from flashdesk.engine.serve.server import Serving, served_name

        key = msg.api_key or None
        try:
            if self.engine is None or self.folders is None:
                raise FlashDeskError("load a model first: the server serves the loaded model")
            check_exposure(msg.host, key)
            self.stop_server()  # a running one makes way for the new settings
            target = self.folders[0]
            serving = Serving(
                self.engine,
                self.control,
                host=msg.host,
                port=msg.port,
                api_key=key,
                model=served_name(target),
                sampling_defaults=sampling_defaults(target),
                schedule=self.requests.put,
                on_record=self.send_traffic,
                step_delay=self.step_delay,
            )
        except FlashDeskError as exc:
            self.send(p.ServerState(False, error=str(exc), host=msg.host, port=msg.port, api_key_required=bool(key)))
            return
        with self.state_lock:
            self.serving = serving
        self.send(
            p.ServerState(
                True,
                serving.url,
                model=serving.model,
                host=msg.host,
                port=serving.thread.port,
                api_key_required=bool(key),
            )
        )

    def stop_server(self, announce: bool = False) -> None:
        """Stop the server if one runs (any thread); ServerState(running=False) says so, or always with
        `announce`."""
        with self.state_lock:
            serving, self.serving = self.serving, None
        if serving is not None:
            serving.stop()
        if serving is not None or announce:
            self.send(p.ServerState(False))

    def http_job(self, job) -> None:
        """An HTTP request's turn on the engine (a job of a server stopped since was already answered)."""
        with self.state_lock:
            serving = self.serving
        if serving is not None:
            serving.runner.execute(job)

    def send_traffic(self, record) -> None:
        usage = record.usage
        self.send(
            p.ServerTraffic(
                record.id,
                record.status,
                record.reason,
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens,
                usage.drafted,
                usage.accepted,
                usage.tau,
                record.seconds,
                usage.decode_tokens_per_second,
                record.stream,
                record.message,
                usage.method,
            )
        )

    def generate(self, msg: p.Generate) -> None:
        from flashdesk.engine.decode.sampling import SamplingParams
        from flashdesk.engine.errors import FlashDeskError
        from flashdesk.engine.decode.turn import ChatTurn, TurnEnd

        engine = self.engine
        if engine is None:
            raise FlashDeskError("no model is loaded")
        rid = msg.request_id
        turn = ChatTurn(
            engine,
            msg.messages,
            SamplingParams(msg.temperature, msg.top_p, msg.top_k, msg.seed),
            msg.max_tokens,
            thinking=msg.thinking,
            ignore_eos=msg.ignore_eos,
            policy=msg.context_policy,
            reuse=msg.reuse,
        )
        prompt_tokens = len(turn.prompt)
        tracker = OriginTracker(engine.tokenizer, set() if msg.ignore_eos else engine.eos)

        def should_stop() -> bool:
            with self.state_lock:
                return rid in self.cancels or self.stopping.is_set()

        with self.state_lock:
            self.active, self.step = rid, 0
            if rid in self.cancels:  # cancelled while it waited in the queue
                self.active = None
                self.cancels.pop(rid)
                self.send(p.Finished(rid, "cancelled", "", "", [], prompt_tokens, 0.0, 0.0, {}, -1, None))
                return
        fitted = turn.fitted
        self.send(p.Started(rid, prompt_tokens, turn.reused, fitted.dropped, fitted.max_new_tokens, fitted.cut_chars))
        steps = turn.run(self.control, should_stop)
        try:
            for item in steps:
                if isinstance(item, TurnEnd):
                    cancel_step = self.cancels.get(rid) if item.reason == "cancelled" else None
                    self.send(
                        p.Finished(
                            rid,
                            item.reason,
                            item.text,
                            item.thought,
                            item.token_ids,
                            prompt_tokens,
                            turn.prefill,
                            item.elapsed,
                            item.stats,
                            item.last_step,
                            cancel_step,
                        )
                    )
                    return
                event = item.event
                self.send(
                    p.Step(
                        rid,
                        event.index,
                        list(event.emitted),
                        list(event.draft),
                        event.accepted,
                        event.answer,
                        event.thought,
                        tracker.spans(event.emitted, event.accepted, event.answer),
                        event.seconds,
                        event.draft_seconds,
                        event.verify_seconds,
                        item.elapsed,
                        item.stats,
                        event.method,
                    )
                )
                with self.state_lock:
                    self.step = event.index + 1
                if self.step_delay:
                    time.sleep(self.step_delay)
        finally:
            steps.close()  # the engine settles its cache before the next request
            with self.state_lock:
                self.active = None
                self.cancels.pop(rid, None)


def _load_facts(engine, target: Path, draft: Path | None, memory: int) -> dict:
    """What `doctor --report` keeps of a load: names, device, settings, and on a GPU the memory
    allocated against the memory plan (never a prompt)."""
    import torch

    model = engine.model
    facts = {
        "model": model_name(target),
        "drafter": model_name(draft) if draft else None,
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "kv_dtype": engine.kv_dtype,
        "context_limit": engine.context_limit,
        "allocated_bytes": memory,
        "self_tested": bool(engine.kernel_checks),
        "fallback_note": engine.fallback_note(),
        "cuda_graphs": engine.cuda_graphs(),
    }
    if model.device.type == "cuda":
        facts["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(model.device))
        try:
            from flashdesk.engine.loading.memory_plan import plan_memory, target_weight_bytes

            weights, _ = target_weight_bytes(target, model.cfg, None, model.dtype.itemsize)
            plan = plan_memory(
                model.cfg,
                weights,
                engine.context_limit,
                engine.kv_dtype,
                tuple(d.cfg if d is engine.drafter else d.assistant.cfg for d in engine.methods.values()) or None,
                model.dtype.itemsize,
            )
            facts.update(planned_bytes=plan.total, plan=plan.lines())
        except Exception as exc:  # noqa: BLE001 - the record is informative only
            facts["plan_error"] = f"{type(exc).__name__}: {exc}"
    return facts


def _rss() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - memory is informative only
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _protocol_stream():
    """Keep the real stdout for protocol lines; send fd 1 (stray prints) to stderr."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", encoding="utf-8", buffering=1)


def main() -> int:
    out = _protocol_stream()
    try:
        worker = Worker(out)
    except BaseException as exc:  # noqa: BLE001 - a broken torch install is reported, not a traceback
        out.write(
            p.encode(
                p.Error(
                    p.CRASH,
                    f"the engine cannot start: {type(exc).__name__}: {exc}",
                    during="startup",
                    details=traceback.format_exc(),
                )
            )
            + "\n"
        )
        out.flush()
        return 1
    reader = threading.Thread(target=worker.read, args=(_lines(sys.stdin.buffer),), daemon=True)
    reader.start()
    return worker.run()


def _lines(stream):
    for raw in stream:
        line = raw.decode("utf-8", errors="replace").strip()
        if line:
            yield line


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: the reader thread may hold stdin's lock while Python finalizes
