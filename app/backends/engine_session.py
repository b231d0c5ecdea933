"""The app's view of the engine: one worker process, the model it has loaded, and how to restart it.

Why apart from the worker client: the client only moves messages; this keeps the state the window
shows (starting, loading, ready, stopped) and what to do again after a crash (start a new worker,
load the same model with the same settings, restore the speculation settings). Requests made
before the worker is up wait here until it says it is ready.
"""

from __future__ import annotations

import uuid

from PySide6.QtCore import QObject, Signal

from flashdesk import protocol as p
from flashdesk.app.backends.worker_client import WorkerClient

STOPPED, STARTING, IDLE, LOADING, READY, DEAD = "stopped", "starting", "idle", "loading", "ready", "dead"


class EngineSession(QObject):
    state_changed = Signal(str)
    ready = Signal(object)  # protocol.Ready (a new worker process is up)
    load_progress = Signal(object)
    loaded = Signal(object)  # protocol.Loaded
    inspected = Signal(object)
    demo_created = Signal(object)
    surveyed = Signal(object)  # protocol.Surveyed
    pull_progress = Signal(object)  # protocol.PullProgress
    pull_checked = Signal(object)  # protocol.PullChecked
    pulled = Signal(object)  # protocol.Pulled
    pull_cancelled = Signal(object)  # protocol.PullCancelled
    started = Signal(object)
    token_count = Signal(object)  # protocol.TokenCount
    steps = Signal(list)
    finished = Signal(object)
    bench_progress = Signal(object)  # protocol.BenchProgress
    bench_result = Signal(object)  # protocol.BenchResult
    bench_runs = Signal(object)  # protocol.BenchRuns
    error = Signal(object)  # protocol.Error
    server_state = Signal(object)  # protocol.ServerState (the HTTP server on the loaded engine)
    server_traffic = Signal(object)  # protocol.ServerTraffic (one per HTTP chat completion)
    died = Signal(str)

    def __init__(self, parent: QObject | None = None, env: dict[str, str] | None = None):
        super().__init__(parent)
        self.client = WorkerClient(self, env)
        self.state = STOPPED
        self.info: p.Loaded | None = None
        self.load_settings: dict | None = None
        self.speculation: tuple[bool, int | str | None, str | None] = (True, None, None)  # on, length, method
        self.models_folder: str | None = None  # Settings' models folder, sent with what looks for models
        self.death: str | None = None
        self._waiting: list = []
        self.client.ready.connect(self._ready)
        self.client.event.connect(self._event)
        self.client.steps.connect(self.steps)
        self.client.died.connect(self._died)

    @property
    def pid(self) -> int | None:
        return self.client.pid

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)

    # -- requests -------------------------------------------------------------------------------------

    def ensure_started(self) -> None:
        if not self.client.running:
            self.death = None
            self._set_state(STARTING)
            self.client.start()

    def _send(self, msg) -> None:
        self.ensure_started()
        if self.client.is_ready:
            self.client.send(msg)
        else:
            self._waiting.append(msg)

    def inspect(
        self, target: str, draft: str | None, context: int | None, device: str = "auto", assistant: str | None = None
    ) -> None:
        self._send(p.Inspect(target, draft, context, device, assistant, self.models_folder))

    def survey(self, demo_folder: str | None = None) -> None:
        """Ask what the setup page offers: the recommended pair's fit and the models on disk."""
        self._send(p.Survey(demo_folder, self.models_folder))

    def create_demo(self, folder: str) -> None:
        self._send(p.CreateDemo(folder))

    def pull(self, repo_id: str) -> None:
        """Download a Hub model into the cache (the worker needs no model loaded for it)."""
        self._send(p.Pull(repo_id, self.models_folder))

    def cancel_pull(self, repo_id: str) -> None:
        """Stop the download of `repo_id`: dropped if it still waits here, else the worker stops it."""
        waiting = [m for m in self._waiting if isinstance(m, p.Pull) and m.repo_id == repo_id]
        if waiting:
            self._waiting = [m for m in self._waiting if m not in waiting]
            self.pull_cancelled.emit(p.PullCancelled(repo_id))
        elif self.client.running:
            self.client.send(p.CancelPull(repo_id))

    def load(self, settings: dict) -> None:
        self.load_settings = dict(settings)
        self.info = None
        self.ensure_started()
        self._set_state(LOADING)
        self._send(
            p.Load(
                settings["target"],
                settings.get("draft"),
                settings.get("device", "auto"),
                settings.get("dtype", "auto"),
                settings.get("kv_dtype", "auto"),
                settings.get("context"),
                settings.get("assistant"),
                self.models_folder,
            )
        )

    def restart(self) -> None:
        """A new worker; the last model loaded again."""
        self.client.stop(1000)
        self._waiting.clear()
        self.info = None
        if self.load_settings:
            self.load(self.load_settings)
        else:
            self.ensure_started()

    def generate(self, msg: p.Generate) -> bool:
        if self.state != READY:
            return False
        self._send(msg)
        return True

    def count_tokens(self, messages: list[dict], thinking: bool) -> str | None:
        """Ask how many tokens `messages` make as a prompt; the answer is a `token_count` signal with
        the returned request id (None: no model is loaded, nothing asked). The worker answers at once,
        also while a reply streams."""
        if self.state != READY or not self.client.is_ready:
            return None
        rid = uuid.uuid4().hex[:12]
        self.client.send(p.CountTokens(rid, messages, thinking))
        return rid

    def cancel(self, request_id: str) -> None:
        if self.client.running:
            self.client.send(p.Cancel(request_id))

    def bench(self, tasks: list[str], draft_lengths: list, prompts_per_task: int, max_new_tokens: int) -> str | None:
        """Benchmark the loaded pair; the request id (Cancel stops it), or None when no model is ready."""
        if self.state != READY:
            return None
        rid = uuid.uuid4().hex[:12]
        self._send(p.Bench(rid, list(tasks), list(draft_lengths), prompts_per_task, max_new_tokens))
        return rid

    def bench_history(self) -> None:
        """Ask for the kept bench runs (a `bench_runs` signal answers)."""
        self._send(p.BenchHistory(uuid.uuid4().hex[:12]))

    def loaded_speculation(self) -> tuple[bool, int | str | None, str | None]:
        """The speculation settings for the models loaded now: a kept method they do not have (an
        assistant's, or auto with one draft model) gives way to their default (None), as the
        panel shows it; the kept choice stays for the next load that has it."""
        enabled, length, method = self.speculation
        methods = self.info.methods if self.info is not None else []
        if method not in methods and not (method == p.AUTO_DRAFT_LENGTH and len(methods) > 1):
            method = None
        return enabled, length, method

    def set_speculation(self, enabled: bool, draft_length: int | str | None, method: str | None = None) -> None:
        self.speculation = (enabled, draft_length, method)
        if self.client.is_ready:
            self.client.send(p.SetSpeculation(enabled, draft_length, method))

    def unload(self) -> None:
        """Free the model's memory; the worker stays up (Loaded again with `restart` or setup)."""
        if self.client.is_ready:
            self.client.send(p.Unload())

    def shutdown(self) -> None:
        self._waiting.clear()
        self.client.stop()
        self._set_state(STOPPED)

    # -- events ---------------------------------------------------------------------------------------

    def _ready(self, msg: p.Ready) -> None:
        if self.state == STARTING:
            self._set_state(IDLE)
        self.client.send(p.SetSpeculation(*self.speculation))
        waiting, self._waiting = self._waiting, []
        for request in waiting:
            self.client.send(request)
        self.ready.emit(msg)

    def _event(self, msg) -> None:
        """Update the session's state for the events that change it, then pass each one on."""
        if isinstance(msg, p.Loaded):
            self.info = msg
            self._set_state(READY)
            self.client.send(p.SetSpeculation(*self.loaded_speculation()))
        elif isinstance(msg, p.Unloaded) or (isinstance(msg, p.Error) and msg.during in ("load", "startup")):
            self.info = None
            self._set_state(IDLE)
        signal = {
            p.LoadProgress: self.load_progress,
            p.Loaded: self.loaded,
            p.Inspected: self.inspected,
            p.DemoCreated: self.demo_created,
            p.Surveyed: self.surveyed,
            p.PullProgress: self.pull_progress,
            p.PullChecked: self.pull_checked,
            p.Pulled: self.pulled,
            p.PullCancelled: self.pull_cancelled,
            p.Started: self.started,
            p.Finished: self.finished,
            p.TokenCount: self.token_count,
            p.BenchProgress: self.bench_progress,
            p.BenchResult: self.bench_result,
            p.BenchRuns: self.bench_runs,
            p.ServerState: self.server_state,
            p.ServerTraffic: self.server_traffic,
            p.Error: self.error,
        }.get(type(msg))
        if signal is not None:
            signal.emit(msg)

    def _died(self, reason: str) -> None:
        self.death = reason
        self.info = None
        self._waiting.clear()
        self._set_state(DEAD)
        self.died.emit(reason)
