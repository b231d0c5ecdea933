"""One click to start on a GPU (issue 11): the setup page offers the recommended pair, says from the
memory plan whether and with how much context it fits this card before downloading, then downloads
and loads it; the models on disk are listed to pick from, the demo included. Beside the pair, a box
adds Gemma 4's MTP assistant (issue 32), with the fit of the three on this card.

The fake Hub serves a tiny target, drafter and assistant under the real ids; FLASHDESK_FAKE_GPU
stands for the card (name, free GiB, total GiB), since this machine has none; the load itself runs on
the CPU."""

from __future__ import annotations

import pytest
from fake_hub import FakeHub
from PySide6.QtCore import Qt

from flashdesk.engine.hub.recommended import (
    FAKE_GPU_ENV,
    RECOMMENDED,
    RECOMMENDED_ASSISTANT,
    assistant_fit,
    recommended_fit,
    survey,
)
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


@pytest.fixture(scope="module")
def assistant_files(tmp_path_factory):
    from tiny_assistant import write_assistant

    folder = tmp_path_factory.mktemp("rec-assistant")
    write_assistant(folder, seed=5)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def hub(pair_files, assistant_files):
    with FakeHub() as server:
        server.add_repo(RECOMMENDED[0], pair_files[0])
        server.add_repo(RECOMMENDED[1], pair_files[1])
        server.add_repo(RECOMMENDED_ASSISTANT, assistant_files)
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


# -- the MTP assistant beside the pair -----------------------------------------------------------------


def surveyed(monkeypatch, tmp_path, gpu: str, on_disk: tuple = ()) -> dict:
    """The survey as the window receives it (every field of the engine's Survey), for a card
    "NAME,FREE_GIB,TOTAL_GIB"; `on_disk`: Hub ids listed as complete."""
    from dataclasses import asdict

    monkeypatch.setenv(FAKE_GPU_ENV, gpu)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    found = asdict(survey())
    found["models"] = [
        {"name": repo, "kind": "?", "target": None, "draft": None, "size": 1, "complete": True} for repo in on_disk
    ]
    return found


def test_the_assistant_box_offers_the_three_with_their_fit(qtbot, monkeypatch, tmp_path) -> None:
    from flashdesk.app.pages.setup_page import SetupPage

    page = SetupPage()
    qtbot.addWidget(page)
    snug = surveyed(monkeypatch, tmp_path, "NVIDIA GeForce RTX 4090,16.6,24")  # the pair fits, the three do not
    page.show_survey(snug)
    box = page.with_assistant
    assert not box.isHidden() and not box.isChecked()
    assert box.text() == "and Gemma 4's MTP assistant, to compare (0.8 GB)"
    assert RECOMMENDED_ASSISTANT in box.toolTip()
    assert page.fit.text() == snug["text"] and page.recommended_button.isEnabled()

    box.setChecked(True)  # the fit shown and the one click follow the box
    assert page.fit.text() == snug["assistant"]["text"] and "with the MTP assistant" in page.fit.text()
    assert not page.recommended_button.isEnabled() and page.recommended_button.toolTip() == page.fit.text()
    box.setChecked(False)
    assert page.fit.text() == snug["text"] and page.recommended_button.isEnabled()

    roomy = surveyed(monkeypatch, tmp_path, "NVIDIA GeForce RTX 4090,23.5,24", on_disk=RECOMMENDED)
    page.show_survey(roomy)
    box.setChecked(True)
    assert page.recommended_button.isEnabled()
    assert page.recommended_button.text() == "Download and load"  # the pair is here, the assistant is not
    with qtbot.waitSignal(page.recommended_requested) as clicked:
        qtbot.mouseClick(page.recommended_button, Qt.MouseButton.LeftButton)
    sel = clicked.args[0]
    assert (sel["target"], sel["draft"], sel["assistant"]) == (*RECOMMENDED, RECOMMENDED_ASSISTANT)
    assert sel["context"] == roomy["assistant"]["context"] == 32768
    assert page.selection()["assistant"] == RECOMMENDED_ASSISTANT  # in the MTP assistant field

    here = surveyed(monkeypatch, tmp_path, "NVIDIA GeForce RTX 4090,23.5,24", (*RECOMMENDED, RECOMMENDED_ASSISTANT))
    page.show_survey(here)
    assert box.text().endswith("(on this computer)") and page.recommended_button.text() == "Load"


def test_without_the_assistant_in_the_survey_the_box_is_not_offered(qtbot, monkeypatch, tmp_path) -> None:
    """A survey from a worker whose message does not carry the assistant: the pair alone, as before."""
    from flashdesk.app.pages.setup_page import SetupPage

    page = SetupPage()
    qtbot.addWidget(page)
    found = surveyed(monkeypatch, tmp_path, "NVIDIA GeForce RTX 4090,23.5,24")
    page.with_assistant.setChecked(True)
    page.show_survey({k: v for k, v in found.items() if k != "assistant"})
    assert page.with_assistant.isHidden() and not page.wants_assistant()
    with qtbot.waitSignal(page.recommended_requested) as clicked:
        qtbot.mouseClick(page.recommended_button, Qt.MouseButton.LeftButton)
    assert clicked.args[0]["assistant"] is None and page.selection()["assistant"] is None


def test_the_box_downloads_and_loads_the_assistant_too(qtbot, open_setup, hub) -> None:
    w = open_setup(hub.url, "NVIDIA GeForce RTX 4090,23.5,24")
    page = w.setup
    card = ("NVIDIA GeForce RTX 4090", int(23.5 * GIB), 24 * GIB)
    assert page.survey["assistant"] == assistant_fit(card)  # the worker's survey carries the assistant's fit
    page.with_assistant.setChecked(True)
    assert page.fit.text().startswith("Fits NVIDIA GeForce RTX 4090") and "MTP assistant" in page.fit.text()
    qtbot.mouseClick(page.recommended_button, Qt.MouseButton.LeftButton)
    assert page.assistant.text() == RECOMMENDED_ASSISTANT and page.draft.text() == RECOMMENDED[1]
    until(lambda: w.session.state == "ready", timeout_ms=WAIT_MS)
    fetched = {
        url.split("/resolve/")[0].strip("/") for method, url, _ in hub.log if method == "GET" and "/resolve/" in url
    }
    assert fetched == {*RECOMMENDED, RECOMMENDED_ASSISTANT}  # each through the pull path
    assert w.session.info.methods == ["dflash", "mtp"]  # the three loaded
