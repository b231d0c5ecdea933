"""A new user's first session, as screenshots to look at: nothing the window says may be stale.

    xvfb-run -a .venv/bin/python packaging/walkthrough.py [--out /tmp/walk]

In a fresh data folder: the first start (setup page), the demo model, a reply, a second
conversation, switching back, the engine killed (SIGKILL), Enter while it is down, a restart, a
reply after it, and the setup page again. At each step it saves a shot and prints what the status
bar, the message box and the crash banner say, so a reader checks both. The tests assert each of
these states on its own (tests/test_app_*.py); this shows them together, as a user meets them.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "flashdesk-walkthrough")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["FLASHDESK_DATA_DIR"] = tempfile.mkdtemp(prefix="flashdesk-walk-")

    from PySide6.QtWidgets import QApplication

    app = QApplication(sys.argv)
    from flashdesk import paths
    from flashdesk.app import theme
    from flashdesk.app.backends.engine_session import EngineSession
    from flashdesk.app.main_window import MainWindow
    from flashdesk.app.history.store import Store

    theme.apply(app)

    def wait(condition, seconds: float = 120.0) -> None:
        end = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > end:
                raise TimeoutError(f"walkthrough: timed out waiting for {condition}")
            app.processEvents()
            time.sleep(0.01)

    shots = 0

    def shot(name: str) -> None:
        nonlocal shots
        end = time.monotonic() + 0.6
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.01)
        shots += 1
        w.grab().save(str(args.out / f"{shots:02d}-{name}.png"))
        banner = w.crash_banner.label.text() if w.crash_banner.isVisible() else "-"
        print(
            f"{shots:2d} {name}\n   status: {w.engine_label.text()}\n   box:    "
            f"{w.composer.edit.placeholderText()}\n   banner: {banner}",
            flush=True,
        )

    def say(text: str | None) -> None:
        if text is not None:
            w.composer.edit.setPlainText(text)
        w.composer._submit()
        wait(lambda: w.controller.busy)
        wait(lambda: not w.controller.busy)

    w = MainWindow(Store(paths.database_path()), EngineSession())
    w.resize(1440, 900)
    w.show()
    shot("first-run")
    wait(lambda: w.setup.survey is not None)
    shot("first-run-surveyed")
    w.setup.demo_button.click()
    wait(lambda: w.session.state == "ready")
    shot("demo-ready")
    say("Write a Python function to read a file.")
    shot("first-reply")
    first = w.controller.conversation.id
    w.new_conversation()
    say("What does the os module do?")
    shot("second-conversation")
    w.controller.open(first)
    shot("switched-back")
    os.kill(w.session.pid, signal.SIGKILL)
    wait(lambda: w.session.state == "dead")
    shot("engine-killed")
    w.composer.edit.setPlainText("Are you there?")
    w.composer._submit()
    shot("enter-while-down")
    w.crash_banner.button.click()
    wait(lambda: w.session.state == "ready")
    shot("restarted")
    say(None)  # the message kept in the box
    shot("reply-after-restart")
    w.show_setup()
    wait(lambda: w.setup.survey is not None and w.setup.on_disk.count() > 1)
    shot("setup-again")
    w.close()
    print(f"{shots} shots in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
