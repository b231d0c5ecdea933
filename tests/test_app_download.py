"""Downloading a Hub model from the setup page: the worker's Pull request, and the page's Download.

The fake Hub (tests/fake_hub.py) runs in the test process on 127.0.0.1; the worker process gets
HF_ENDPOINT pointing at it and HF_HUB_CACHE in a temporary folder, so the real Hub is never
contacted. A slowed handler sends the weights in small timed pieces, so that a test can see the
progress bar move and cancel half-way.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from fake_hub import FakeHub
from PySide6.QtCore import Qt

from flashdesk import protocol as p
from test_models import closed_port_url
from test_telemetry import NVMLError, fake_nvml, until
from test_worker import WorkerProcess

REPO = "tiny-org/tiny-gemma"
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> dict[str, bytes]:
    """The files of a tiny sharded Gemma 4 checkpoint, as {name: bytes}."""
    from tiny_checkpoints import write_checkpoint

    folder = tmp_path_factory.mktemp("hub-target")
    write_checkpoint(folder, shard=True)
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.is_file()}


def slow_weights(hub: FakeHub, piece: int = 16 * 1024) -> None:
    """Send *.safetensors bodies in `piece`-byte pieces, `hub.delay` seconds apart."""
    base = hub.server.RequestHandlerClass
    hub.delay = 0.0

    class Slow(base):
        def _send(self, status, body, headers, head=False):
            path = self.path.split("?", 1)[0]
            if head or not path.endswith(".safetensors") or not hub.delay or len(body) <= piece:
                return super()._send(status, body, headers, head)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for start in range(0, len(body), piece):
                    self.wfile.write(body[start : start + piece])
                    self.wfile.flush()
                    time.sleep(hub.delay)
            except OSError:  # the client hung up (a cancelled download)
                self.close_connection = True

    hub.server.RequestHandlerClass = Slow


@pytest.fixture
def hub(checkpoint, tmp_path):
    with FakeHub() as server:
        server.add_repo(REPO, {**checkpoint, "README.md": b"# tiny\n"})
        slow_weights(server)
        yield server


def hub_env(url: str, cache: Path) -> dict[str, str]:
    return {
        "HF_ENDPOINT": url,
        "HF_HUB_CACHE": str(cache),
        "NO_PROXY": "127.0.0.1,localhost",
        "HF_TOKEN": "",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


def weights(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: data for name, data in files.items() if name.endswith(".safetensors")}


def partials(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"models--{REPO.replace('/', '--')}/blobs/*.incomplete"))


# -- the worker -----------------------------------------------------------------------------------------


def test_worker_pull_reports_monotone_progress_then_pulled(hub, checkpoint, tmp_path) -> None:
    cache = tmp_path / "hf-cache"
    hub.delay = 0.01  # a few tenths of a second: several progress events
    w = WorkerProcess(**hub_env(hub.url, cache))
    try:
        assert isinstance(w.next(), p.Ready)
        w.send(p.Pull(REPO))  # no model loaded: none is needed
        events = w.until((p.Pulled, p.Error, p.PullCancelled), timeout=WAIT_MS / 1000)
        assert isinstance(events[-1], p.Pulled), events[-1]
        progress = [e for e in events if isinstance(e, p.PullProgress)]
        sized = [e for e in progress if e.total_bytes]
        total = sum(len(data) for name, data in checkpoint.items())
        assert len(sized) >= 3
        assert all(e.repo_id == REPO for e in progress)
        assert len({e.total_bytes for e in sized}) == 1 and sized[0].total_bytes == total  # known from the start
        dones = [e.done_bytes for e in sized]
        assert dones == sorted(dones) and dones[0] < total and dones[-1] == total
        assert any(e.file.endswith(".safetensors") and 0 < e.done_bytes < total for e in sized)
        # what the engine would make of it came once, before any weights byte
        checks = [i for i, e in enumerate(events) if isinstance(e, p.PullChecked)]
        assert len(checks) == 1 and events[checks[0]].ok, events[checks[0]]
        first_weights = min(
            i
            for i, e in enumerate(events)
            if isinstance(e, p.PullProgress) and e.file.endswith(".safetensors") and e.done_bytes
        )
        assert checks[0] < first_weights
        folder = Path(events[-1].folder)
        assert folder.parent.name == "snapshots" and events[-1].size == total
        for name, data in checkpoint.items():
            assert (folder / name).read_bytes() == data
        assert not partials(cache)

        # the worker then checks the pulled model by its Hub id, as the setup page does
        w.send(p.Inspect(REPO, None, 4096))
        inspected = w.until((p.Inspected, p.Error))[-1]
        assert isinstance(inspected, p.Inspected) and inspected.ok, inspected

        # a cancel for a download that is not running is ignored: the next Pull is not cancelled
        w.send(p.CancelPull("other/repo"))
        w.send(p.Pull(REPO))
        assert isinstance(w.until((p.Pulled, p.Error, p.PullCancelled))[-1], p.Pulled)
        w.send(p.Pull("not a hub id"))
        err = w.until((p.Pulled, p.Error))[-1]
        assert isinstance(err, p.Error) and err.during == "pull" and "org/name" in err.message
    finally:
        w.close()


def test_worker_pull_unreachable_hub_says_so(tmp_path) -> None:
    url = closed_port_url()
    w = WorkerProcess(**hub_env(url, tmp_path / "hf-cache"))
    try:
        assert isinstance(w.next(), p.Ready)
        w.send(p.Pull(REPO))
        err = w.until((p.Pulled, p.Error, p.PullCancelled), timeout=WAIT_MS / 1000)[-1]
        assert isinstance(err, p.Error) and err.kind == p.BAD_INPUT and err.during == "pull"
        assert f"cannot reach {url}" in err.message and "connection" in err.message
    finally:
        w.close()


# -- the setup page -------------------------------------------------------------------------------------


@pytest.fixture
def open_window(qtbot, monkeypatch, tmp_path):
    """open_window(endpoint) -> a shown MainWindow on the setup page, its worker downloading from `endpoint`."""
    from flashdesk.app.backends.engine_session import EngineSession
    from flashdesk.app.main_window import MainWindow
    from flashdesk.app.history.store import Store
    from flashdesk.app.panels.telemetry import TelemetrySampler

    windows = []

    def make(endpoint: str):
        data = tmp_path / "data"
        data.mkdir(exist_ok=True)
        monkeypatch.setenv("FLASHDESK_DATA_DIR", str(data))
        store = Store(data / "flashdesk.db")
        session = EngineSession(env=hub_env(endpoint, tmp_path / "hf-cache"))
        sampler = TelemetrySampler(fake_nvml(init_error=NVMLError("NVML Shared Library Not Found")), interval=0.2)
        window = MainWindow(store, session, sampler)
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        assert window.pages.currentIndex() == 0  # no model yet: the setup page
        return window

    yield make
    for window in windows:
        window.close()
        window.store.close()


def type_hub_id(qtbot, w, text: str = REPO) -> None:
    w.setup.target.setFocus()
    qtbot.keyClicks(w.setup.target, text)
    assert w.setup.download_button.isVisible() and w.setup.hub_ids() == [text]


def test_download_shows_progress_cancel_keeps_the_partial_and_download_continues(
    qtbot, open_window, hub, checkpoint, tmp_path
) -> None:
    cache = tmp_path / "hf-cache"
    hub.delay = 0.03  # ~2 MB in 16 kB pieces: a few seconds, time to watch and to cancel
    w = open_window(hub.url)
    page = w.setup
    assert not page.download_button.isVisible()
    type_hub_id(qtbot, w)
    values: list[int] = []
    page.progress.valueChanged.connect(lambda v: values.append(v) if page.progress.maximum() == 1000 else None)
    ticks = []  # the event loop keeps running during the download: the window stays responsive
    from PySide6.QtCore import QTimer

    timer = QTimer(w)
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(20)

    qtbot.mouseClick(page.download_button, Qt.MouseButton.LeftButton)
    assert page.downloading and page.cancel_download_button.isVisible() and page.progress.isVisible()
    assert not page.check_button.isEnabled() and not page.download_button.isVisible()
    until(lambda: page.progress.maximum() == 1000 and page.progress.value() >= 250, timeout_ms=WAIT_MS)
    assert "Downloading tiny-org/tiny-gemma" in page.status.text() and " of " in page.status.text()
    assert ".safetensors" in page.status.text()
    # what the engine would make of the model shows before its weights are in
    assert "checked before its weights" in page.plan.toPlainText() and "verdict    ok" in page.plan.toPlainText()
    qtbot.mouseClick(page.cancel_download_button, Qt.MouseButton.LeftButton)
    until(lambda: not page.downloading, timeout_ms=WAIT_MS)
    timer.stop()
    assert "cancelled" in page.status.text() and "continue" in page.status.text()
    assert not page.progress.isVisible() and page.download_button.isVisible() and page.check_button.isEnabled()
    assert len(values) >= 3 and values == sorted(values) and values[-1] < 1000  # it moved, and stopped short
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert gaps and max(gaps) < 1.0, max(gaps)  # the UI never froze for a second
    kept = partials(cache)
    assert kept and all(f.stat().st_size > 0 for f in kept)  # the weights file cut off keeps its bytes
    done = {f.name: f.stat().st_size for f in kept}
    assert w.session.state == "idle" and w.session.pid  # the worker is still up

    hub.delay = 0.0
    hub.log.clear()
    qtbot.mouseClick(page.download_button, Qt.MouseButton.LeftButton)
    until(lambda: not page.downloading, timeout_ms=WAIT_MS)
    until(lambda: "FlashDesk can load" in page.status.text() or "Not usable" in page.status.text(), timeout_ms=WAIT_MS)
    assert "verdict    ok" in page.plan.toPlainText(), page.status.text() + page.plan.toPlainText()
    assert "FlashDesk can load" in page.status.text()
    assert page.target.text() == REPO
    assert not partials(cache)
    by_sha = {hashlib.sha256(data).hexdigest(): name for name, data in weights(checkpoint).items()}
    for partial, size in done.items():  # each partial continued with a Range request from where it stopped
        name = by_sha[partial.removesuffix(".incomplete")]
        assert (name, f"bytes={size}-") in hub.gets(name), hub.gets(name)


def test_download_from_an_unreachable_hub_says_so(qtbot, open_window, tmp_path) -> None:
    url = closed_port_url()
    w = open_window(url)
    type_hub_id(qtbot, w)
    qtbot.mouseClick(w.setup.download_button, Qt.MouseButton.LeftButton)
    until(lambda: not w.setup.downloading, timeout_ms=WAIT_MS)
    text = w.setup.status.text()
    assert text.startswith("Download failed: ") and f"cannot reach {url}" in text and "connection" in text
    assert w.setup.download_button.isVisible() and w.setup.check_button.isEnabled()


def test_pull_messages_round_trip() -> None:
    for msg in (
        p.Pull(REPO),
        p.CancelPull(REPO),
        p.PullProgress(REPO, "model.safetensors", 5, 10),
        p.Pulled(REPO, "/cache/snapshots/abc", 10),
        p.PullCancelled(REPO, 5, 10),
        p.PullChecked(REPO, ["verdict  ok"], []),
    ):
        assert p.decode(p.encode(msg)) == msg
