"""The FlashDesk window.

For now a placeholder: the engine is usable from the command line (`flashdesk generate`,
`flashdesk doctor`), the chat window comes with the app issue. This module, like all of
`flashdesk.app`, never imports torch: the engine runs in its own process.
"""

from __future__ import annotations

import os
import signal
import sys

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QLabel, QMainWindow, QVBoxLayout, QWidget

from flashdesk import __version__

APP_NAME = "FlashDesk"

PLACEHOLDER_TEXT = (
    "<h2>FlashDesk</h2>"
    "<p>The engine is ready: use it from the command line for now.</p>"
    "<pre>flashdesk generate --model DIR --prompt \"Hello\"\n"
    "flashdesk doctor</pre>"
    "<p>The chat window, with live speed, acceptance, VRAM and power, is coming.</p>"
)


class MainWindow(QMainWindow):
    """Placeholder main window. Uses the platform's style and palette (Qt's defaults),
    so it follows the system's light or dark theme."""

    def __init__(self) -> None:
        super().__init__()
        self.setWindowTitle(APP_NAME)
        self.setObjectName("flashdeskMainWindow")

        self.message = QLabel(PLACEHOLDER_TEXT)
        self.message.setObjectName("placeholderMessage")
        self.message.setTextFormat(Qt.TextFormat.RichText)
        self.message.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        central = QWidget(self)
        layout = QVBoxLayout(central)
        layout.setContentsMargins(32, 32, 32, 32)
        layout.addWidget(self.message)
        self.setCentralWidget(central)
        self.statusBar().showMessage(f"FlashDesk {__version__}")
        self.resize(720, 480)


def _no_display() -> bool:
    """True on Linux/BSD when Qt would find no screen and abort (no X11, no Wayland, no
    explicit platform such as offscreen)."""
    if not sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        return False
    return not (
        os.environ.get("DISPLAY")
        or os.environ.get("WAYLAND_DISPLAY")
        or os.environ.get("QT_QPA_PLATFORM")
    )


def application() -> QApplication:
    """The process's QApplication, created on first use."""
    app = QApplication.instance()
    if app is None:
        QApplication.setApplicationName(APP_NAME)
        QApplication.setApplicationDisplayName(APP_NAME)
        QApplication.setApplicationVersion(__version__)
        QApplication.setOrganizationName(APP_NAME)
        QApplication.setDesktopFileName("flashdesk")
        app = QApplication(sys.argv[:1])
    return app  # type: ignore[return-value]


def create_main_window() -> MainWindow:
    application()
    return MainWindow()


def run_app() -> int:
    """Open the window and run the event loop; returns the process exit code."""
    if _no_display():
        print(
            "flashdesk: no display found (neither DISPLAY nor WAYLAND_DISPLAY is set).\n"
            "Run it on a desktop session, or use the engine directly: "
            "`flashdesk generate --model DIR --prompt TEXT`, `flashdesk doctor`.",
            file=sys.stderr,
        )
        return 2
    app = application()
    window = MainWindow()
    window.show()

    # Ctrl+C in the terminal closes the app cleanly. Python runs signal handlers only when it
    # gets control, so a timer hands it control a few times a second while Qt's loop runs.
    interrupted = False

    def on_sigint(signum, frame) -> None:
        nonlocal interrupted
        interrupted = True
        app.quit()

    previous = signal.signal(signal.SIGINT, on_sigint)
    wake = QTimer()
    wake.timeout.connect(lambda: None)
    wake.start(200)
    try:
        code = int(app.exec())
    finally:
        wake.stop()
        signal.signal(signal.SIGINT, previous)
    return 130 if interrupted else code


if __name__ == "__main__":
    sys.exit(run_app())
