"""uvicorn around the API: the listening socket, the server in the foreground (`flashdesk serve`) or on a
thread of its own (the worker, the tests), and the whole of a running server for the worker.

Why we bind the socket ourselves: a busy port or an unknown address is then an error with its
reason before anything else happens (uvicorn would log it and exit the process), and port 0 gives
a free port whose number we know. An IPv6 address may be given as in a URL (`[::1]`).
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Callable

import uvicorn

from flashdesk.engine.serve.app import create_app
from flashdesk.engine.serve.connections import with_header_deadline
from flashdesk.engine.serve.errors import ServeError
from flashdesk.engine.serve.hosts import allowed_hosts
from flashdesk.engine.serve.limits import Limits
from flashdesk.engine.serve.runner import Job, JobRecord, Runner

GRACE_SECONDS = 5  # how long a stopping server lets open requests finish before cancelling them


def plain_host(host: str) -> str:
    """An address without the brackets a URL puts around IPv6 ("[::1]" -> "::1")."""
    host = host.strip()
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one), or a ServeError saying why not."""
    if not 0 <= port <= 65535:
        raise ServeError(f"port {port} is not a TCP port (0..65535)")
    host = plain_host(host)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ServeError(f"cannot listen on {host}: not an address of this machine ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        if os.name != "nt":  # on Windows this would let two servers share the port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {url(host, port)}: {exc.strerror or exc}") from None
    return sock


def url(host: str, port: int) -> str:
    host = plain_host(host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def served_name(target: Path) -> str:
    """The model's name in the API: flashdesk-demo for the demo pair, else its folder's (org/name for
    a Hugging Face cache snapshot)."""
    from flashdesk.engine.hub.demo import is_complete
    from flashdesk.engine.loading.model_card import model_name

    return "flashdesk-demo" if is_complete(Path(target).parent) else model_name(Path(target))


class Server(uvicorn.Server):
    """uvicorn's server, telling us when it listens and when it starts to stop."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_started: Callable[[], None] = lambda: None,
        on_stopping: Callable[[], None] = lambda: None,
    ):
        super().__init__(config)
        self.on_started, self.on_stopping = on_started, on_stopping

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            self.on_started()

    async def shutdown(self, sockets=None) -> None:
        self.on_stopping()  # the runner ends its queued jobs, so open requests finish at once
        await super().shutdown(sockets)


def config(app, *, quiet: bool, limits: Limits = Limits()) -> uvicorn.Config:
    """quiet: no logging set up (the worker's stderr is the app's crash report) and no access log;
    `limits.header_seconds`: the deadline for a request's headers (connections.py)."""
    from uvicorn.config import LOGGING_CONFIG
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return uvicorn.Config(
        app,
        lifespan="off",
        timeout_graceful_shutdown=GRACE_SECONDS,
        server_header=False,
        http=with_header_deadline(AutoHTTPProtocol, limits.header_seconds),
        log_config=None if quiet else LOGGING_CONFIG,  # uvicorn's default unless quiet
        access_log=not quiet,
    )


class ServerThread:
    """A Server on a thread and event loop of its own, listening on `sock`."""

    def __init__(self, server: Server, sock: socket.socket):
        self.server, self.sock = server, sock
        self.port = sock.getsockname()[1]
        self.error: BaseException | None = None
        self._listening = threading.Event()
        server.on_started = self._listening.set
        self.thread = threading.Thread(target=self._run, name="flashdesk-http", daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # noqa: BLE001 - uvicorn exits on startup failures; keep why
            self.error = exc
        finally:
            self._listening.set()

    def start(self, timeout: float = 30) -> None:
        self.thread.start()
        if not self._listening.wait(timeout) or not self.server.started:
            self.stop()
            raise ServeError(
                f"the HTTP server did not start: {self.error!r}"
                if self.error
                else "the HTTP server did not start in time"
            )

    def stop(self, timeout: float = GRACE_SECONDS + 10) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)
        self.sock.close()


class Serving:
    """A running server of the worker: its runner (jobs go on the worker's queue) and its thread."""

    def __init__(
        self,
        engine,
        control,
        *,
        host: str,
        port: int,
        api_key: str | None,
        model: str,
        sampling_defaults: dict,
        schedule: Callable[[Job], None],
        on_record: Callable[[JobRecord], None],
        step_delay: float = 0.0,
        limits: Limits = Limits(),
    ):
        sock = bind(host, port)
        self.runner = Runner(engine, control, schedule=schedule, on_record=on_record, step_delay=step_delay)
        self.app = create_app(self.runner, model, api_key, sampling_defaults, limits=limits, hosts=allowed_hosts(host))
        self.thread = ServerThread(
            Server(config(self.app, quiet=True, limits=limits), on_stopping=self.runner.close), sock
        )
        self.url, self.model = url(host, self.thread.port), model
        self.thread.start()

    def stop(self) -> None:
        """Stop taking requests, end the queued ones, and wait for the open ones to finish."""
        self.runner.close()
        self.thread.stop()
        close_app(self.app)


def close_app(app) -> None:
    """Let the app's prompt threads and their tokenizer copies go (prompt.py)."""
    prompts = getattr(app.state, "prompts", None)
    if prompts is not None:
        prompts.close()
