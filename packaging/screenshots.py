"""Render screenshots of the window in use into docs/, under Xvfb (no desktop needed).

    .venv/bin/python packaging/screenshots.py          # re-runs itself under xvfb-run when there is no display
    .venv/bin/python packaging/screenshots.py --out /tmp/shots

It works in a fresh temporary data folder: it creates the demo model, sets it up through the setup
page, and chats with it, so the speed, speculation and memory readouts are real (on the CPU). The
demo is a toy (its text only looks like code or English); one shot shows a conversation this script writes into the
store itself, to show how Markdown, code blocks and a thought render (its title says so).
Needs Debian's xvfb package (apt-get install xvfb) when no display is available.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE = (1440, 900)

SAMPLE_TITLE = "Rendering sample (written by the screenshot script)"
SAMPLE_QUESTION = "How do I read a file line by line in Python?"
SAMPLE_THOUGHT = (
    "The user wants to iterate over lines. The idiomatic way is a `with` block and a for loop "
    "over the file object; mention `encoding` and stripping newlines."
)
SAMPLE_ANSWER = """Open the file in a `with` block and loop over it; the file object yields one line at a time,
so even a huge file never has to fit in memory:

```python
with open("notes.txt", encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
        print(number, line.rstrip("\\n"))
```

- `encoding="utf-8"` avoids surprises from the platform's default encoding.
- Each `line` keeps its trailing newline; `rstrip("\\n")` removes it.
- For the whole file at once, `Path("notes.txt").read_text().splitlines()` is shorter.
"""


def _rexec_under_xvfb() -> int:
    if not shutil.which("xvfb-run"):
        print("screenshots: no display and no xvfb-run; install Debian's xvfb package", file=sys.stderr)
        return 2
    cmd = ["xvfb-run", "-a", "-s", f"-screen 0 {SIZE[0] + 200}x{SIZE[1] + 200}x24 -dpi 96", sys.executable, *sys.argv]
    return subprocess.call(cmd, env={**os.environ, "FLASHDESK_SCREENSHOTS_CHILD": "1"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs"), help="folder for the PNG files (default: docs/)")
    args = parser.parse_args()
    if not os.environ.get("DISPLAY") and not os.environ.get("FLASHDESK_SCREENSHOTS_CHILD"):
        return _rexec_under_xvfb()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="flashdesk-shots-"))
    os.environ["FLASHDESK_DATA_DIR"] = str(data)
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb")
    try:
        return Shooter(out, data).run()
    finally:
        shutil.rmtree(data, ignore_errors=True)


class Shooter:
    def __init__(self, out: Path, data: Path):
        from PySide6.QtWidgets import QApplication

        from flashdesk.app.main import application

        self.out, self.data = out, data
        self.app: QApplication = application()

    def wait(self, condition, seconds: float = 60.0, what: str = "") -> None:
        end = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > end:
                raise TimeoutError(f"screenshots: timed out waiting for {what or condition}")
            self.app.processEvents()
            time.sleep(0.01)

    def settle(self, seconds: float = 0.4) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.app.processEvents()
            time.sleep(0.01)

    def shot(self, window, name: str) -> None:
        self.settle()
        path = self.out / name
        window.grab().save(str(path))
        print(f"wrote {path}")

    def window(self, delay: str | None = None):
        from flashdesk import paths
        from flashdesk.app.backends.engine_session import EngineSession
        from flashdesk.app.main_window import MainWindow
        from flashdesk.app.history.store import Store

        session = EngineSession(env={"FLASHDESK_WORKER_STEP_DELAY": delay} if delay else None)
        window = MainWindow(Store(paths.database_path()), session)
        window.resize(*SIZE)
        window.show()
        return window

    def run(self) -> int:
        # 1. first run: the setup page, the demo created and checked (the memory plan)
        w = self.window()
        w.setup.demo_button.click()
        self.wait(lambda: w.session.state == "ready", what="the demo model to load")
        w.show_setup()
        w.setup.check_button.click()
        self.wait(lambda: "verdict" in w.setup.plan.toPlainText(), what="the memory plan")
        self.shot(w, "screenshot-setup.png")
        w.close()
        w.store.close()

        # 2. a reply streaming, speculation on, panels live
        w = self.window(delay="0.05")
        self.wait(lambda: w.session.state == "ready", what="the demo model to load")
        w.spec.length.setValue(8)
        self.stream(w, "Write a Python function that reads a file and returns the number of lines in it.", seconds=1.2)
        self.shot(w, "screenshot-chat.png")
        self.shot(w.spec, "screenshot-speculation.png")  # the speculation panel alone, mid-reply
        self.wait(lambda: not w.controller.busy, 120, "the reply to end")

        # 3. a stored conversation: Markdown, a code block with its copy link, a thought
        self._sample(w)
        self.shot(w, "screenshot-markdown.png")

        # 4. the Benchmark page after a run over every task type (the demo pair on the CPU)
        w.show_bench()
        page = w.bench
        for box in page.task_boxes.values():
            box.setChecked(True)
        page.per_task.setValue(2)
        page.max_tokens.setValue(96)
        page.run()
        self.wait(lambda: page.running is None and page.report is not None, 600, "the benchmark")
        self.wait(lambda: page.history.count() > 0, what="the list of runs")
        self.shot(w, "screenshot-bench.png")
        w.close()
        w.store.close()

        # 5. dark theme, reply coloured by origin, the telemetry half of the side panel
        os.environ["FLASHDESK_THEME"] = "dark"
        from flashdesk.app import theme

        theme.apply(self.app)
        w = self.window(delay="0.05")
        self.wait(lambda: w.session.state == "ready", what="the demo model to load")
        w.spec.colour.setChecked(True)
        self.stream(w, "Write a Python function to return the n-th Fibonacci number.", seconds=3.0)
        bar = w.side.verticalScrollBar()
        bar.setValue(bar.maximum())
        self.shot(w, "screenshot-dark.png")
        w.spec.colour.setChecked(False)
        w.controller.stop()
        self.wait(lambda: not w.controller.busy, 60, "the reply to stop")
        w.close()
        w.store.close()
        return 0

    def stream(self, w, prompt: str, seconds: float) -> None:
        """Send `prompt` and let the reply stream for `seconds` (or to its end). Greedy, the demo's own
        default: a model this small samples text its drafter cannot predict, so speculation pays only
        greedily (assets/demo_model/NOTICE.md)."""
        w.new_conversation()
        w.controller.update_settings(
            "", {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 3000, "thinking": False}
        )
        w.composer.edit.setPlainText(prompt)
        w.composer._submit()
        end = time.monotonic() + seconds
        self.wait(lambda: w.controller.busy, what="the reply to start")
        while time.monotonic() < end and w.controller.busy:
            self.settle(0.05)

    def _sample(self, w) -> None:
        store = w.store
        conv = store.create_conversation(SAMPLE_TITLE)
        store.add_message(conv.id, "user", SAMPLE_QUESTION)
        reply = store.add_message(conv.id, "assistant", SAMPLE_ANSWER)
        store.update_message(reply.id, thought=SAMPLE_THOUGHT, thought_seconds=1.8)
        w.controller.open(conv.id)
        w.controller.conversations_changed.emit()
        widget = w.chat.widget(reply.id)
        widget.toggle_thought()


if __name__ == "__main__":
    sys.exit(main())
