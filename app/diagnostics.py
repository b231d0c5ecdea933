"""Help > Copy diagnostics: `flashdesk doctor --report -` run in a child process (the window never
loads torch), its report put on the clipboard for the user to paste into a question. The report
holds versions, the GPU and driver, the kernel self-tests, the last load and the last errors, and
no prompts or replies (engine/cli/report.py)."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, QProcess, Signal
from PySide6.QtGui import QGuiApplication

TIMEOUT_MS = 60_000


class DiagnosticsCopier(QObject):
    done = Signal(bool, str)  # copied, and what to tell the user

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.process: QProcess | None = None

    def start(self) -> bool:
        """Start collecting; False while a collection already runs."""
        if self.process is not None:
            return False
        self.process = QProcess(self)
        self.process.setProgram(sys.executable)
        self.process.setArguments(["-m", "flashdesk", "doctor", "--report", "-"])
        self.process.finished.connect(self._finished)
        self.process.errorOccurred.connect(self._failed)
        self.process.start()
        return True

    def _finished(self, code: int, _status) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        out = bytes(process.readAllStandardOutput()).decode("utf-8", errors="replace")
        err = bytes(process.readAllStandardError()).decode("utf-8", errors="replace").strip()
        process.deleteLater()
        if code != 0 or not out.strip():
            last = err.splitlines()[-1] if err else f"exit code {code}"
            self.done.emit(False, f"The diagnostics could not be collected: {last}")
            return
        QGuiApplication.clipboard().setText(out)
        self.done.emit(True, "Diagnostics copied: paste them into your question (they hold no prompts or replies)")

    def _failed(self, error) -> None:
        if error == QProcess.ProcessError.FailedToStart and self.process is not None:
            process, self.process = self.process, None
            process.deleteLater()
            self.done.emit(False, f"The diagnostics could not be collected: {sys.executable} did not start")
