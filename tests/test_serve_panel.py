"""The app's API server panel (issue 12 item 2) with the real worker: the toggle serves the loaded demo model,
the URL is copied, each request shows in the traffic list, and the toggle stops it."""

from __future__ import annotations

import httpx
import openai
import pytest
from PySide6.QtWidgets import QApplication

from flashdesk.app.backends.engine_session import EngineSession
from flashdesk.app.panels.server_panel import ServerPanel
from test_telemetry import until

LOAD_MS = 90_000


@pytest.fixture
def loaded(qtbot, tmp_path):
    from flashdesk.engine.hub.demo import create_demo

    target, drafter = create_demo(tmp_path / "demo")
    session = EngineSession()
    session.load({"target": str(target), "draft": str(drafter), "device": "cpu", "context": 4096})
    until(lambda: session.state == "ready", timeout_ms=LOAD_MS)
    yield session
    session.shutdown()


def test_the_toggle_serves_the_loaded_model_and_lists_its_traffic(qtbot, loaded) -> None:
    panel = ServerPanel(loaded)
    qtbot.addWidget(panel)
    assert panel.toggle.isEnabled() and not panel.copy.isEnabled()
    panel.port.setValue(0)  # any free port
    panel.toggle.setChecked(True)
    until(lambda: panel.url.text(), timeout_ms=30_000)
    base = panel.url.text()
    assert base.startswith("http://127.0.0.1:") and base.endswith("/v1")
    assert "flashdesk-demo" in panel.status.text() and not panel.port.isEnabled()
    panel.copy.click()
    assert QApplication.clipboard().text() == base

    reply = openai.OpenAI(base_url=base, api_key="unused", max_retries=0).chat.completions.create(
        model="flashdesk-demo", messages=[{"role": "user", "content": "Hello"}], max_tokens=12
    )
    until(lambda: panel.traffic.count() == 1, timeout_ms=30_000)
    line = panel.traffic.item(0).text()
    assert line.startswith(f"200 {reply.choices[0].finish_reason}")
    assert f"{reply.usage.completion_tokens} out" in line and "τ" in line
    assert panel.summary.text() == f"1 request, {reply.usage.completion_tokens} tokens generated"

    panel.toggle.setChecked(False)
    until(lambda: not panel.url.text() and panel.port.isEnabled(), timeout_ms=30_000)
    with pytest.raises(httpx.ConnectError):
        httpx.get(base.removesuffix("/v1") + "/health")


def test_other_devices_need_the_key_the_panel_makes(qtbot, loaded) -> None:
    panel = ServerPanel(loaded)
    qtbot.addWidget(panel)
    panel.port.setValue(0)
    panel.everywhere.setChecked(True)
    key = panel.key.text()
    assert len(key) >= 24 and not set(key) & set("0O1lI")  # no letters that read alike
    panel.toggle.setChecked(True)
    until(lambda: panel.url.text(), timeout_ms=30_000)
    assert "API key required" in panel.status.text() and "other devices" in panel.status.text()
    assert "0.0.0.0" not in panel.url.text()  # the address other devices use
    assert panel.key.isEnabled() and panel.key.isReadOnly()  # fixed while serving, and can be copied
    port = panel.url.text().removesuffix("/v1").rsplit(":", 1)[1]
    assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
    assert (
        httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0][
            "id"
        ]
        == "flashdesk-demo"
    )
    loaded.unload()  # unloading stops the server first
    until(lambda: not panel.url.text(), timeout_ms=30_000)
    assert not panel.toggle.isChecked()


def test_a_panel_made_before_the_model_loads_follows_it(qtbot, tmp_path) -> None:
    from flashdesk.engine.hub.demo import create_demo

    target, drafter = create_demo(tmp_path / "demo")
    session = EngineSession()
    panel = ServerPanel(session)
    qtbot.addWidget(panel)
    try:
        assert not panel.toggle.isEnabled() and panel.status.text() == "Load a model to serve it."
        session.load({"target": str(target), "draft": str(drafter), "device": "cpu", "context": 4096})
        until(lambda: session.state == "ready", timeout_ms=LOAD_MS)
        assert panel.toggle.isEnabled() and panel.status.text() == "Not serving."  # not the stale line
    finally:
        session.shutdown()


def test_the_window_shows_api_traffic_in_its_speed_panel(qtbot, monkeypatch, tmp_path) -> None:
    from flashdesk import protocol as p
    from flashdesk.app.main_window import MainWindow
    from flashdesk.app.history.store import Store

    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    session = EngineSession()
    window = MainWindow(Store(tmp_path / "f.db"), session)
    qtbot.addWidget(window)
    try:
        session.server_traffic.emit(p.ServerTraffic("r1", 200, "stop", 10, 0, 40, 30, 20, 3.5, 1.0, 42.0))
        assert window.server_panel.requests == 1
        assert window.telemetry.text("tps_server") == "42.0 tok/s, τ 3.50 (last of 1 API requests)"
    finally:
        window.close()
        window.store.close()
        session.shutdown()
