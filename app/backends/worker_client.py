"""Starts and watches the engine process and turns its event lines into Qt signals.

Why QProcess: it reads the worker's pipes from the Qt event loop (no thread of our own) and
reports the process's end however it comes (exit, crash, kill), which is what lets the window
survive a CUDA out-of-memory or a `kill -9` of the engine.

Step events arrive as fast as the engine makes them; they are collected and handed on at most
FLUSH_HZ times a second as one list, which is all the eye needs. Every other event is handed on
at once, after the steps collected before it, so the order is kept.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import deque

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from flashdesk import protocol as p

FLUSH_HZ = 30
STDERR_LINES = 60


class WorkerClient(QObject):
    ready = Signal(object)  # protocol.Ready
    event = Signal(object)  # every event but Step and Ready
    steps = Signal(list)  # [protocol.Step], each with `.received` (time.monotonic()) added
    died = Signal(str)  # the worker ended without being asked to: what happened

    def __init__(self, parent: QObject | None = None, env: dict[str, str] | None = None):
        super().__init__(parent)
        self.extra_env = dict(env or {})
        self.proc: QProcess | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES)
        self._pending_steps: list = []
        self._flush = QTimer(self)
        self._flush.setSingleShot(True)
        self._flush.setInterval(int(1000 / FLUSH_HZ))
        self._flush.timeout.connect(self.flush_steps)
        self._stopping = False
        self._ready = False
        self._err_buf = b""

    # -- process life -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.state() != QProcess.ProcessState.NotRunning

    @property
    def is_ready(self) -> bool:
        return self.running and self._ready

    @property
    def pid(self) -> int | None:
        return int(self.proc.processId()) if self.running and self.proc.processId() else None

    def start(self) -> None:
        if self.running:
            return
        self._stopping, self._ready = False, False
        self.stderr_tail.clear()
        proc = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        for key, value in self.extra_env.items():
            env.insert(key, value)
        env.insert("PYTHONUNBUFFERED", "1")
        proc.setProcessEnvironment(env)
        proc.readyReadStandardOutput.connect(self._read_stdout)
        proc.readyReadStandardError.connect(self._read_stderr)
        proc.finished.connect(self._finished)
        proc.errorOccurred.connect(self._error)
        self.proc = proc
        proc.start(sys.executable, ["-m", "flashdesk.engine.worker"])

    def send(self, msg) -> bool:
        """Write a request; False when no worker is running."""
        if not self.running:
            return False
        self.proc.write((p.encode(msg) + "\n").encode("utf-8"))
        return True

    def stop(self, wait_ms: int = 3000) -> None:
        """Ask the worker to exit; kill it if it does not within `wait_ms`."""
        if not self.running:
            return
        self._stopping = True
        proc = self.proc
        self.send(p.Shutdown())
        proc.closeWriteChannel()
        if not proc.waitForFinished(wait_ms):
            proc.kill()
            proc.waitForFinished(1000)

    def kill(self) -> None:
        """End the worker at once, as a crash would (tests, and a hung engine)."""
        if self.running and self.pid:
            os.kill(self.pid, signal.SIGKILL)

    # -- reading --------------------------------------------------------------------------------------

    def _read_stdout(self) -> None:
        proc = self.sender() if isinstance(self.sender(), QProcess) else self.proc
        if proc is None:
            return
        while proc.canReadLine():
            line = bytes(proc.readLine()).decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                msg = p.decode(line)
            except p.ProtocolError:
                self.stderr_tail.append(f"(unreadable line from the worker) {line[:200]}")
                continue
            self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        if isinstance(msg, p.Step):
            msg.received = time.monotonic()
            self._pending_steps.append(msg)
            if not self._flush.isActive():
                self._flush.start()
            return
        self.flush_steps()
        if isinstance(msg, p.Ready):
            self._ready = True
            self.ready.emit(msg)
        else:
            self.event.emit(msg)

    def flush_steps(self) -> None:
        self._flush.stop()
        if self._pending_steps:
            batch, self._pending_steps = self._pending_steps, []
            self.steps.emit(batch)

    def _read_stderr(self) -> None:
        proc = self.sender() if isinstance(self.sender(), QProcess) else self.proc
        if proc is None:
            return
        data = self._err_buf + bytes(proc.readAllStandardError())
        *lines, self._err_buf = data.split(b"\n")
        for raw in lines:
            text = raw.decode("utf-8", errors="replace").rstrip()
            if text:
                self.stderr_tail.append(text)
                if os.environ.get("FLASHDESK_DEBUG"):
                    print(f"[worker] {text}", file=sys.stderr)

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        proc = self.sender() if isinstance(self.sender(), QProcess) else self.proc
        if proc is not self.proc:
            return  # an earlier worker, already replaced
        self._read_stdout()
        self._read_stderr()
        self.flush_steps()
        self._ready = False
        if self._stopping:
            return
        self.died.emit(self.describe_exit(code, status))

    def _error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and not self._stopping:
            self.died.emit(
                f"The engine process could not be started ({sys.executable} -m flashdesk.engine.worker): "
                f"{self.proc.errorString() if self.proc else error}"
            )

    def describe_exit(self, code: int, status: QProcess.ExitStatus) -> str:
        """A sentence for the window: how the worker ended, and the last thing it wrote."""
        if status == QProcess.ExitStatus.CrashExit:
            what = "The engine process was killed"
            if code in (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
                what += f" by {signal.Signals(code).name}"
            if code == signal.SIGKILL:
                what += " (the system may have run out of memory, or the process was ended)"
        else:
            what = f"The engine process exited unexpectedly with code {code}"
        hint = self.last_error_line()
        return f"{what}." + (f" Last message: {hint}" if hint else "")

    def last_error_line(self) -> str:
        for line in reversed(self.stderr_tail):
            low = line.lower()
            if "error" in low or "out of memory" in low or "killed" in low:
                return line.strip()[:300]
        return ""
