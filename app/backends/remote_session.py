"""A remote engine: an OpenAI-compatible server (vLLM, SGLang, another FlashDesk) that the chat uses
instead of the local worker.

Why it looks like EngineSession: the chat controller and the panels speak to an engine through
`state`, `info`, `generate`, `cancel` and the signals `started`, `steps`, `finished` and `error`
carrying the worker protocol's messages; this offers the same, so a reply from a server is stored,
shown and measured by the same code as a local one (stream_steps.py turns chunks into Steps).

Why a thread with an asyncio loop: nothing on the network may block the window, and a cancel must
close the stream at once even while a read waits (cancelling the task does that; a blocked
synchronous read could not be interrupted). Results come back through a queued signal. Each
connection has a number; results of an earlier one are dropped, so a slow answer from the server
left behind never lands in the window.

While connected, /metrics is read every POLL_S seconds: the server's output tokens per second
(`server_metrics` signal) and, for a reply, the speculation figures from the scrape before it to
the latest (server_metrics.py), refreshed once more when the reply ends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Qt, QTimer, Signal

from flashdesk import protocol as p
from flashdesk.app.backends.engine_session import LOADING, READY, STOPPED
from flashdesk.app.backends.openai_client import OpenAIServer, ServerAddress, ServerError, chat_body, server_address
from flashdesk.app.backends.prom_metrics import parse
from flashdesk.app.backends.server_metrics import SERVER_NAMES, Snapshot, read_snapshot, spec_between, tokens_per_second
from flashdesk.app.backends.stream_steps import StreamSteps

POLL_S = 1.0
FLUSH_HZ = 30  # as the worker client: steps reach the window at most this often


@dataclass(frozen=True)
class ServerCheck:
    """What Check found at an address: the models, and what /metrics offers (or the error)."""

    address: str
    models: list[str] = field(default_factory=list)
    context: dict = field(default_factory=dict)  # model id -> max_model_len, where the server says
    server: str | None = None  # VLLM, SGLANG, FLASHDESK (from /metrics or the models' owner), or None
    has_metrics: bool = False
    speculates: bool = False  # /metrics has speculation figures
    error: str | None = None

    @property
    def text(self) -> str:
        if self.error:
            return self.error
        name = SERVER_NAMES.get(self.server, "The server")
        models = ", ".join(self.models) if self.models else "no model"
        if not self.has_metrics:
            metrics = "it has no /metrics, so speculation figures will show n/a"
        elif self.speculates:
            metrics = "its /metrics has speculative-decoding figures"
        else:
            metrics = (
                "its /metrics has no speculation figures (it does not speculate, or it is not vLLM, SGLang "
                "or FlashDesk), so they will show n/a"
            )
        return f"{name} at {self.address} serves {models}; {metrics}."


@dataclass(frozen=True)
class ServerReading:
    """One scrape of /metrics while connected: the server's output tokens per second since the scrape
    before (all its requests); `error` when the scrape failed."""

    tokens_per_second: float | None
    error: str | None = None


class _Connection:
    """The network side of one connection (lives on the network thread)."""

    def __init__(self, server: OpenAIServer, model: str, snapshot: Snapshot | None):
        self.server = server
        self.model = model
        self.has_metrics = snapshot is not None
        self.snapshot = snapshot


class _Turn:
    """One reply on the network thread: its steps so far, and the scrape it began after."""

    def __init__(self, msg: p.Generate, conn: _Connection):
        self.msg = msg
        self.conn = conn
        self.steps = StreamSteps(msg.request_id, time.monotonic())
        self.baseline = conn.snapshot

    def stats(self) -> dict | None:
        """The speculation figures from the scrape before the reply to the latest."""
        return spec_between(self.baseline, self.conn.snapshot) if self.conn.snapshot is not None else None


async def scrape(server: OpenAIServer) -> Snapshot | None:
    """The server's /metrics as a snapshot; None when it has none."""
    text = await server.metrics_text()
    return read_snapshot(parse(text), time.monotonic()) if text is not None else None


def _server_kind(snapshot: Snapshot | None, models: list[dict]) -> str | None:
    """What the server is: by its metrics' names, else by the models' owner (vLLM says "vllm")."""
    if snapshot is not None and snapshot.server:
        return snapshot.server
    owners = {str(m.get("owned_by", "")).lower() for m in models}
    return next((kind for kind in SERVER_NAMES if kind in owners), None)


def _model_context(model: dict) -> int:
    value = model.get("max_model_len") or model.get("context_length") or 0
    return int(value) if isinstance(value, (int, float)) else 0


class RemoteSession(QObject):
    state_changed = Signal(str)
    connected = Signal(object)  # protocol.Loaded describing the server's model
    checked = Signal(object)  # ServerCheck
    server_metrics = Signal(object)  # ServerReading, about once a second while connected
    started = Signal(object)
    steps = Signal(list)
    finished = Signal(object)
    error = Signal(object)  # protocol.Error; during "connect" or "generate"
    _post = Signal(object)  # (connection number, kind, payload), from the network thread

    def __init__(self, parent: QObject | None = None, poll_interval: float = POLL_S):
        super().__init__(parent)
        self.poll_interval = poll_interval
        self.state = STOPPED
        self.info: p.Loaded | None = None
        self.settings: dict | None = None  # {"base_url", "api_key", "model"} of the connection
        self.host: str | None = None  # its host:port
        self.server: str | None = None  # VLLM, SGLANG, FLASHDESK or None
        self.has_metrics = False
        self.speculates = False
        self._number = 0  # the connection's number: results of earlier ones are dropped
        self._check_number = 0
        self._requests: set[str] = set()  # replies streaming
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # on the network thread only:
        self._conn: _Connection | None = None
        self._watch: asyncio.Task | None = None  # the connection's task: connect, then poll /metrics
        self._tasks: dict[str, asyncio.Task] = {}
        self._pending_steps: list = []
        self._flush = QTimer(self)
        self._flush.setSingleShot(True)
        self._flush.setInterval(int(1000 / FLUSH_HZ))
        self._flush.timeout.connect(self._flush_steps)
        self._post.connect(self._deliver, Qt.ConnectionType.QueuedConnection)

    # -- the network thread ---------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="flashdesk-remote", daemon=True)
            self._thread.start()
        return self._loop

    def _call(self, fn, *args) -> None:
        """Run `fn(*args)` on the network thread, in the order asked."""
        self._ensure_loop().call_soon_threadsafe(fn, *args)

    def _send(self, number: int, kind: str, payload) -> None:
        try:
            self._post.emit((number, kind, payload))
        except RuntimeError:  # the session is gone (the app is closing)
            pass

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)

    # -- requests -------------------------------------------------------------------------------------

    def check(self, base_url: str, api_key: str | None) -> None:
        """List the server's models and look at its /metrics; a `checked` signal answers."""
        self._check_number += 1
        try:
            address = server_address(base_url)
        except ValueError as exc:
            self.checked.emit(ServerCheck(base_url.strip(), error=str(exc)))
            return
        self._call(self._start_check, self._check_number, address, api_key or None)

    def connect_server(self, settings: dict) -> None:
        """Connect to {"base_url", "api_key", "model"} (model empty: the server's first); `connected`
        or an error during "connect" answers. A connection before is closed first."""
        self.disconnect_server()
        try:
            address = server_address(settings.get("base_url") or "")
        except ValueError as exc:
            self.error.emit(p.Error(p.BAD_INPUT, str(exc), during="connect"))
            return
        self.settings, self.host = dict(settings), address.host
        self._set_state(LOADING)
        self._call(
            self._start_watch,
            self._number,
            address,
            settings.get("api_key") or None,
            (settings.get("model") or "").strip(),
        )

    def reconnect(self) -> None:
        if self.settings:
            self.connect_server(self.settings)

    def disconnect_server(self) -> None:
        """Close the connection; a reply still streaming ends as failed, its text kept."""
        self._number += 1
        self._flush_steps()
        for request_id in sorted(self._requests):
            self.error.emit(p.Error(p.CRASH, "Disconnected from the server.", during="generate", request_id=request_id))
        self._requests.clear()
        if self._loop is not None:
            self._call(self._drop_connection)
        self.info, self.host = None, None
        self.server, self.has_metrics, self.speculates = None, False, False
        self._set_state(STOPPED)

    def generate(self, msg: p.Generate) -> bool:
        if self.state != READY or self.info is None:
            return False
        self._requests.add(msg.request_id)
        self._call(self._start_chat, self._number, msg)
        return True

    def cancel(self, request_id: str) -> None:
        """Close the reply's stream now (the server sees the client leave and stops it)."""
        if request_id in self._requests:
            self._call(self._cancel_chat, request_id)

    def shutdown(self) -> None:
        """Close the connection and end the network thread (the app is closing)."""
        self.disconnect_server()
        loop, self._loop = self._loop, None
        if loop is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(timeout=5)
            except TimeoutError:  # a server that will not let go: the thread is a daemon, the app closes anyway
                pass
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=2)
            self._thread = None

    # -- on the network thread -----------------------------------------------------------------------------

    @staticmethod
    def _start(coro) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(coro)

    @staticmethod
    def _failure(task: asyncio.Task) -> str | None:
        """What went wrong in a task that ended by an unexpected exception (a bug, not the network)."""
        if task.cancelled() or task.exception() is None:
            return None
        exc = task.exception()
        return f"{type(exc).__name__}: {exc}"

    def _start_check(self, number: int, address: ServerAddress, api_key: str | None) -> None:
        def done(task: asyncio.Task) -> None:
            if failure := self._failure(task):
                self._send(number, "checked", ServerCheck(address.host, error=f"The check failed: {failure}"))

        self._start(self._check(number, address, api_key)).add_done_callback(done)

    def _start_watch(self, number: int, address: ServerAddress, api_key: str | None, model: str) -> None:
        def done(task: asyncio.Task) -> None:
            if failure := self._failure(task):
                self._send(number, "error", p.Error(p.CRASH, f"The connection failed: {failure}", during="connect"))

        self._watch = self._start(self._connect(number, address, api_key, model))
        self._watch.add_done_callback(done)

    def _drop_connection(self) -> None:
        """Stop the connection's task and its replies (their results carry an old number: dropped)."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        for task in self._tasks.values():
            task.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            self._start(conn.server.aclose())

    async def _close_all(self) -> None:
        self._drop_connection()
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if pending:
            await asyncio.wait(pending, timeout=3)

    async def _check(self, number: int, address: ServerAddress, api_key: str | None) -> None:
        server = OpenAIServer(address, api_key)
        try:
            models = await server.models()
            snapshot = await scrape(server)
        except ServerError as exc:
            result = ServerCheck(address.host, error=str(exc))
        else:
            result = ServerCheck(
                address.host,
                [m["id"] for m in models],
                {m["id"]: _model_context(m) for m in models if _model_context(m)},
                _server_kind(snapshot, models),
                snapshot is not None,
                bool(snapshot and snapshot.speculates),
            )
        finally:
            await server.aclose()
        self._send(number, "checked", result)

    async def _connect(self, number: int, address: ServerAddress, api_key: str | None, model: str) -> None:
        server = OpenAIServer(address, api_key)
        started = time.monotonic()
        try:
            models = await server.models()
            ids = [m["id"] for m in models]
            if not ids:
                raise ServerError(f"The server at {address.host} serves no model.")
            model = model or ids[0]
            if model not in ids:
                raise ServerError(f"The server at {address.host} does not serve {model!r}; it serves {', '.join(ids)}.")
            snapshot = await scrape(server)
        except ServerError as exc:
            await server.aclose()
            self._send(number, "error", p.Error(p.CRASH, str(exc), during="connect"))
            return
        except asyncio.CancelledError:
            await server.aclose()
            raise
        conn = self._conn = _Connection(server, model, snapshot)
        kind = _server_kind(snapshot, models)
        context = next((_model_context(m) for m in models if m["id"] == model), 0)
        where = f"{SERVER_NAMES.get(kind, 'server')} at {address.host}"
        info = p.Loaded(
            address.api, None, model, "remote", where, None, "", "", context, None, 0, time.monotonic() - started
        )
        self._send(number, "connected", (info, kind, conn.has_metrics, bool(snapshot and snapshot.speculates)))
        while conn.has_metrics:
            await asyncio.sleep(self.poll_interval)
            await self._poll(number, conn)

    async def _poll(self, number: int, conn: _Connection) -> None:
        before = conn.snapshot
        try:
            after = await scrape(conn.server)
        except ServerError as exc:
            self._send(number, "reading", ServerReading(None, str(exc)))
            return
        if after is None:
            self._send(number, "reading", ServerReading(None, "the server's /metrics went away"))
            return
        conn.snapshot = after
        self._send(number, "reading", ServerReading(tokens_per_second(before, after)))

    def _start_chat(self, number: int, msg: p.Generate) -> None:
        if self._conn is None:
            self._send(
                number,
                "error",
                p.Error(p.CRASH, "Not connected to the server.", during="generate", request_id=msg.request_id),
            )
            return
        turn = _Turn(msg, self._conn)
        task = self._tasks[msg.request_id] = self._start(self._chat(number, turn))
        task.add_done_callback(lambda t: self._chat_done(number, turn, t))

    def _cancel_chat(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def _chat(self, number: int, turn: _Turn) -> None:
        conn, steps = turn.conn, turn.steps
        began = False
        try:
            async for parts in conn.server.stream_chat(chat_body(turn.msg, conn.model)):
                if not began:
                    began = True
                    self._send(number, "started", steps.started())
                if parts.error:
                    raise ServerError(f"The server stopped the reply: {parts.error}")
                step = steps.add(parts, time.monotonic(), turn.stats())
                if step is not None:
                    self._send(number, "step", step)
        except ServerError as exc:
            self._send(number, "error", p.Error(p.CRASH, str(exc), during="generate", request_id=turn.msg.request_id))
            return
        if conn.has_metrics:  # the reply's last drafts: read the counters once more
            try:
                conn.snapshot = await scrape(conn.server) or conn.snapshot
            except ServerError:
                pass
        self._send_end(number, steps.finish(time.monotonic(), turn.stats()))

    def _chat_done(self, number: int, turn: _Turn, task: asyncio.Task) -> None:
        """A reply's task ended: a cancelled one (even before it began) ends as cancelled, its text kept;
        one that broke ends as failed."""
        self._tasks.pop(turn.msg.request_id, None)
        if task.cancelled():
            self._send_end(number, turn.steps.finish(time.monotonic(), turn.stats(), reason="cancelled"))
        elif failure := self._failure(task):
            self._send(
                number,
                "error",
                p.Error(
                    p.CRASH,
                    f"The reply from the server failed: {failure}",
                    during="generate",
                    request_id=turn.msg.request_id,
                ),
            )

    def _send_end(self, number: int, messages: list) -> None:
        for message in messages:
            self._send(number, "step" if isinstance(message, p.Step) else "finished", message)

    # -- on the GUI thread ---------------------------------------------------------------------------------

    def _deliver(self, item) -> None:
        number, kind, payload = item
        if kind == "checked":
            if number == self._check_number:
                self.checked.emit(payload)
            return
        if number != self._number:
            return  # from a connection closed since
        if kind == "step":
            payload.received = time.monotonic()
            self._pending_steps.append(payload)
            if not self._flush.isActive():
                self._flush.start()
            return
        self._flush_steps()
        if kind == "connected":
            self.info, self.server, self.has_metrics, self.speculates = payload
            self._set_state(READY)
            self.connected.emit(self.info)
        elif kind == "reading":
            self.server_metrics.emit(payload)
        elif kind == "started":
            self.started.emit(payload)
        elif kind in ("finished", "error"):
            if kind == "error" and payload.during == "connect":
                self.info = None
                self._set_state(STOPPED)
            self._requests.discard(payload.request_id)
            (self.finished if kind == "finished" else self.error).emit(payload)

    def _flush_steps(self) -> None:
        self._flush.stop()
        if self._pending_steps:
            batch, self._pending_steps = self._pending_steps, []
            self.steps.emit(batch)
