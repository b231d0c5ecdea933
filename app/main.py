"""`flashdesk` with no arguments: the Qt application and its window.

Like all of `flashdesk.app`, this never imports torch: the engine runs in its own process, which
the window starts (`flashdesk.engine.worker`).
"""

from __future__ import annotations

import os
import signal
import sys

from PySide6.QtCore import QtMsgType, Qt, QTimer, qInstallMessageHandler
from PySide6.QtGui import QGuiApplication, QIcon
from PySide6.QtWidgets import QApplication, QMessageBox

from flashdesk import __version__
from flashdesk import paths
from flashdesk.app import theme
from flashdesk.app.main_window import APP_NAME, MainWindow
from flashdesk.app.history.store import DatabaseUnavailable, Store


def _no_display() -> bool:
    """True on Linux/BSD when Qt would find no screen and abort (no X11, no Wayland, no
    explicit platform such as offscreen)."""
    if not sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("QT_QPA_PLATFORM"))


_QUIET = ("This plugin does not support propagateSizeHints()",)  # offscreen/Xvfb noise on every resize


def _qt_messages(kind: QtMsgType, _context, text: str) -> None:
    if text in _QUIET or kind == QtMsgType.QtDebugMsg:
        return
    print(f"Qt: {text}", file=sys.stderr)


def application() -> QApplication:
    """The process's QApplication, created on first use, themed to follow the system."""
    app = QApplication.instance()
    if app is None:
        # HiDPI: Qt 6 scales by the screen's factor; pass fractional factors (1.25, 1.5) through
        # instead of rounding them, so text is neither blurry nor too small.
        QGuiApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
        QApplication.setApplicationName(APP_NAME)
        QApplication.setApplicationDisplayName(APP_NAME)
        QApplication.setApplicationVersion(__version__)
        QApplication.setOrganizationName(APP_NAME)
        QApplication.setDesktopFileName("flashdesk")
        qInstallMessageHandler(_qt_messages)
        app = QApplication(sys.argv[:1])
        app.setWindowIcon(QIcon(str(paths.assets_dir() / "flashdesk.svg")))
    theme.apply(app)
    return app  # type: ignore[return-value]


def create_main_window(store: Store | None = None) -> MainWindow:
    application()
    return MainWindow(store or Store(paths.database_path()))


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
    try:
        store = Store(paths.database_path())
    except DatabaseUnavailable as exc:  # locked or read-only: said, and the file is left as it is
        print(f"flashdesk: {exc}", file=sys.stderr)
        QMessageBox.critical(None, "FlashDesk cannot open its database", str(exc))
        return 1
    window = MainWindow(store)
    window.show()

    # Ctrl+C in the terminal closes the app cleanly. Python runs signal handlers only when it
    # gets control, so a timer hands it control a few times a second while Qt's loop runs.
    interrupted = False

    def on_sigint(signum, frame) -> None:
        nonlocal interrupted
        interrupted = True
        window.close()
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
        window.shutdown()  # not close(): that would post a quit to whatever event loop runs next
        store.close()
    return 130 if interrupted else code


if __name__ == "__main__":
    sys.exit(run_app())
