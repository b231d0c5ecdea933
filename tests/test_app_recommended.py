"""One click to start on a GPU (issue 11): the setup page offers the recommended pair, says from the
memory plan whether and with how much context it fits this card before downloading, then downloads
and loads it; the models on disk are listed to pick from, the demo included.

The fake Hub serves a tiny target and drafter under the recommended pair's ids; FLASHDESK_FAKE_GPU
stands for the card (name, free GiB, total GiB), since this machine has none; the load itself runs on
the CPU."""

from __future__ import annotations

import pytest
from fake_hub import FakeHub
from PySide6.QtCore import Qt

from flashdesk.engine.hub.recommended import FAKE_GPU_ENV, RECOMMENDED, recommended_fit
from test_app_download import hub_env
from test_telemetry import NVMLError, fake_nvml, until

WAIT_MS = 90_000
GIB = 1024**3


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory):
    from tiny_checkpoints import write_checkpoint
    from tiny_drafter import write_drafter

    target, draft = tmp_path_factory.mktemp("rec-target"), tmp_path_factory.mktemp("rec-draft")
    write_checkpoint(target)
    write_drafter(draft, seed=3)
    read = lambda folder: {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}  # noqa: E731
    return read(target), read(draft)


@pytest.fixture
def hub(pair_files):
    with FakeHub() as server:
        server.add_repo(RECOMMENDED[0], pair_files[0])
        server.add_repo(RECOMMENDED[1], pair_files[1])
        yield server


@pytest.fixture
def open_setup(qtbot, monkeypatch, tmp_path):
    """open_setup(endpoint, gpu) -> a window on the setup page; `gpu` "NAME,FREE_GIB,TOTAL_GIB" or None."""
    from flashdesk.app.backends.engine_session import EngineSession
    from flashdesk.app.main_window import MainWindow
    from flashdesk.app.history.store import Store
    from flashdesk.app.panels.telemetry import TelemetrySampler

    windows = []

    def make(endpoint: str, gpu: str | None):
        data = tmp_path / "data"
        data.mkdir(exist_ok=True)
        monkeypatch.setenv("FLASHDESK_DATA_DIR", str(data))
        env = hub_env(endpoint, tmp_path / "hf-cache")
        if gpu:
            env[FAKE_GPU_ENV] = gpu
        store = Store(data / "flashdesk.db")
        window = MainWindow(
            store,
            EngineSession(env=env),
            TelemetrySampler(fake_nvml(init_error=NVMLError("NVML Shared Library Not Found")), interval=0.2),
        )
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        until(lambda: window.setup.survey is not None, timeout_ms=WAIT_MS)
        return window

    yield make
    for window in windows:
        window.close()
        window.store.close()


def test_the_fit_is_the_memory_plan_of_the_real_pair():
    big = recommended_fit(("RTX 4090", int(23.5 * GIB), 24 * GIB))
    small = recommended_fit(("RTX 3060", int(11.5 * GIB), 12 * GIB))
    busy = recommended_fit(("RTX 4090", 8 * GIB, 24 * GIB))
    assert big["fits"] and big["context"] == 32768 and big["longest_context"] >= 131072
    assert 14 * GIB < big["needed_bytes"] < 20 * GIB  # the 4-bit target, the bf16 drafter, fp8 KV at 4K
    assert not small["fits"] and small["context"] == 0 and "needs a card with 24 GB" in small["text"]
    assert not busy["fits"] and "close what else uses the GPU" in busy["text"]
    assert recommended_fit(None)["text"].startswith("No NVIDIA GPU here")


def test_fits_then_one_click_downloads_and_loads(qtbot, open_setup, hub, tmp_path) -> None:
    w = open_setup(hub.url, "NVIDIA GeForce RTX 4090,23.5,24")
    page = w.setup
    assert page.fit.text().startswith("Fits NVIDIA GeForce RTX 4090 (23.5 GiB free of 24.0)")
    assert "context up to" in page.fit.text()
    assert page.recommended_button.text() == "Download and load" and page.recommended_button.isEnabled()
    assert "about 18 GB to download" in page.recommended_text.text()
    assert not hub.log  # nothing downloaded to say so

    qtbot.mouseClick(page.recommended_button, Qt.MouseButton.LeftButton)
    assert page.target.text() == RECOMMENDED[0] and page.draft.text() == RECOMMENDED[1]
    assert page.context.value() == 32768
    until(lambda: w.session.state == "ready", timeout_ms=WAIT_MS)
    info = w.session.info
    assert info.block_size and "models--" in info.target and "models--" in info.draft
    assert w.pages.currentIndex() == 1

    w.show_setup()  # now on disk: listed, and the one click only loads
    until(lambda: page.recommended_button.text() == "Load", timeout_ms=WAIT_MS)
    names = [page.on_disk.itemText(i) for i in range(page.on_disk.count())]
    assert any(RECOMMENDED[0] in n and "(model" in n for n in names)
    assert any(RECOMMENDED[1] in n and "DFlash drafter" in n for n in names)


def test_does_not_fit_says_so_and_offers_nothing_to_download(qtbot, open_setup, hub) -> None:
    w = open_setup(hub.url, "NVIDIA GeForce RTX 3060,11.5,12")
    page = w.setup
    assert page.fit.text().startswith("Does not fit NVIDIA GeForce RTX 3060")
    assert not page.recommended_button.isEnabled() and page.recommended_button.toolTip() == page.fit.text()
    assert not hub.log


def test_no_gpu_points_to_the_demo_and_lists_it_once_made(qtbot, open_setup, hub) -> None:
    w = open_setup(hub.url, None)
    page = w.setup
    assert page.fit.text().startswith("No NVIDIA GPU here") and not page.recommended_button.isEnabled()
    assert not page.on_disk.isEnabled()
    qtbot.mouseClick(page.demo_button, Qt.MouseButton.LeftButton)
    until(lambda: w.session.state == "ready", timeout_ms=WAIT_MS)
    w.show_setup()
    until(lambda: page.on_disk.count() == 2, timeout_ms=WAIT_MS)
    page.target.clear()
    page.on_disk.activated.emit(1)  # pick the demo pair
    assert page.target.text().endswith("target") and page.draft.text().endswith("drafter")
    assert page.device.currentText() == "cpu"
