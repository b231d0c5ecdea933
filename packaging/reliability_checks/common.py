"""What the parts of packaging/reliability.py share: the engine process driven over its protocol,
the database's own integrity check, and the Qt event loop turned by hand.

Why a plain subprocess for the worker here (and not the app's QProcess client): the soak and the
bad-input catalogue talk to the engine as any client of the protocol would, byte for byte, so they
can also send lines the app never would; the kill tests use the app's own client instead.
"""

from __future__ import annotations

import functools
import os
import queue
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from flashdesk import protocol as p

START_S = 120  # an engine process that is not up by then is stuck (torch imports in a few seconds)
ANSWER_S = 60  # no request to the demo model takes this long


class WorkerGone(Exception):
    """The engine process ended, or stopped answering, while an answer was awaited."""


class WorkerProcess:
    """`python -m flashdesk.engine.worker` with a reader thread, so that every wait has a deadline."""

    def __init__(self, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flashdesk.engine.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.until(p.Ready, START_S)[-1]
        self.pid = ready.pid

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.put(p.decode(line))
            except p.ProtocolError as exc:  # the worker's own output must always decode: record it
                self.events.put(exc)
        self.events.put(None)

    def send(self, msg) -> None:
        self.send_raw((p.encode(msg)).encode("utf-8"))

    def send_raw(self, line: bytes) -> None:
        """One line as it is (the catalogue sends lines the app never would)."""
        try:
            self.proc.stdin.write(line + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerGone(f"the engine process is gone ({exc})") from exc

    def until(self, kinds, timeout: float = ANSWER_S) -> list:
        """Every event up to and including the first of `kinds`."""
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise WorkerGone(f"no {_names(kinds)} from the engine within {timeout:.0f} s") from None
            if msg is None:
                raise WorkerGone(
                    f"the engine process ended (exit code {self.proc.wait()}) while waiting for {_names(kinds)}"
                )
            if isinstance(msg, Exception):
                raise WorkerGone(f"the engine wrote a line that is not a message: {msg}")
            seen.append(msg)
            if isinstance(msg, kinds):
                return seen

    def answers(self) -> bool:
        """Whether the engine still reads and answers requests (CountTokens is answered at once)."""
        try:
            self.send(p.CountTokens("alive", [{"role": "user", "content": "Are you there?"}]))
            return isinstance(self.until(p.TokenCount, 5)[-1], p.TokenCount)
        except WorkerGone:
            return False

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(p.Shutdown())
                self.proc.stdin.close()
                self.proc.wait(timeout=20)
            except (WorkerGone, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def _names(kinds) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(k.TYPE for k in kinds)


def integrity(path: Path) -> str:
    """SQLite's full `PRAGMA integrity_check` of the database at `path`, in a connection of its own
    (which replays a journal left by a killed process, as the next start would): "ok", or what it found."""
    db = sqlite3.connect(path, timeout=10)
    try:
        return "; ".join(row[0] for row in db.execute("PRAGMA integrity_check"))
    finally:
        db.close()


class EventPump:
    """The Qt event loop, turned by hand until a condition holds (QCoreApplication, offscreen)."""

    def __init__(self):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer

        self.app = QCoreApplication.instance() or QCoreApplication([sys.argv[0]])
        self._wait = QEventLoop.ProcessEventsFlag.WaitForMoreEvents
        self._tick = QTimer()  # wakes the loop, so a wait notices its deadline
        self._tick.start(10)

    def until(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s")
            self.app.processEvents(self._wait)


def replies_run_to_max_tokens() -> None:
    """Make the app's requests ignore the end of turn, as the app's tests do: the demo would often end
    a reply sooner by itself, and a kill must land inside the reply."""
    if not isinstance(p.Generate, functools.partial):
        p.Generate = functools.partial(p.Generate, ignore_eos=True)
