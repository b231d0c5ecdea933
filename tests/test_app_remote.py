"""The window with a server as its engine: a local fake OpenAI-compatible server (tests/fake_openai_server.py)
that speculates and publishes vLLM-style, SGLang-style or no /metrics.

The chat streams from it into the store; the speculation panel shows the acceptance its /metrics
counted; a wrong key, a cancel and a switch back to the local engine each leave the right things
on screen and nothing lost. The local worker is only started by the last test (the switch).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from fake_openai_server import MODEL, REPLY, THOUGHT, FakeOpenAIServer, words
from flashdesk.app.backends.engine_session import EngineSession
from flashdesk.app.main_window import MainWindow
from flashdesk.app.backends.remote_session import RemoteSession
from flashdesk.app.history.store import CANCELLED, COMPLETE, FAILED, Store
from flashdesk.app.panels.telemetry import TelemetrySampler
from flashdesk.app.panels.telemetry_panel import REMOTE_PLOT_TITLE
from test_app_window import LOAD_MS, greedy, messages, send, wait_idle
from test_telemetry import fake_nvml, until

CONNECT_MS = 20_000


@pytest.fixture
def open_remote(qtbot, monkeypatch, tmp_path):
    """open_remote(server=None, api_key="", data_dir=None, model_setting=None) -> a shown MainWindow whose
    store says to chat with `server` (None: what the data folder's store already says). The sampler
    reads a fake NVIDIA card, so a test sees that this computer's GPU is not shown as the server's."""
    windows: list[MainWindow] = []

    def make(
        server: FakeOpenAIServer | None = None,
        api_key: str = "",
        data_dir: Path | None = None,
        model_setting: dict | None = None,
    ) -> MainWindow:
        data_dir = data_dir or tmp_path / "data"
        data_dir.mkdir(exist_ok=True)
        monkeypatch.setenv("FLASHDESK_DATA_DIR", str(data_dir))
        store = Store(data_dir / "flashdesk.db")
        if model_setting is not None:
            store.set_setting("model", model_setting)
        if server is not None:
            store.set_setting("remote", {"base_url": server.url, "api_key": api_key, "model": ""})
            store.set_setting("engine", "remote")
        window = MainWindow(
            store, EngineSession(), TelemetrySampler(fake_nvml(), interval=0.2), RemoteSession(poll_interval=0.2)
        )
        qtbot.addWidget(window)
        window.show()
        QTest.qWaitForWindowActive(window)
        windows.append(window)
        if store.setting("engine") == "remote":
            until(lambda: window.remote.state != "loading", timeout_ms=CONNECT_MS)
        return window

    yield make
    for window in windows:
        window.close()
        window.store.close()


def test_chat_streams_from_a_vllm_server_and_shows_its_acceptance(qtbot, open_remote, tmp_path) -> None:
    with FakeOpenAIServer("vllm") as server:
        w = open_remote(server)
        assert w.remote.state == "ready"
        host = f"127.0.0.1:{server.port}"
        assert w.model_label.text() == f"{MODEL} · vLLM at {host}"
        assert w.engine_label.text() == f"Connected: {MODEL} on vLLM at {host} · context 8,192 tokens"
        # the server's launch decides speculation: the controls say so and are off
        assert w.spec.enabled.isChecked() and not w.spec.enabled.isEnabled() and not w.spec.length.isVisible()
        assert w.spec.length_note.text() == "set by vLLM" and "vLLM's /metrics" in w.spec.source.text()
        assert not w.spec.histogram.isVisible() and not w.spec.colour.isVisible()  # no per-step drafts from a server

        greedy(w, max_tokens=200)
        seen: list[str] = []
        w.controller.reply_progress.connect(lambda r: seen.append(r.text))
        send(qtbot, w, "Hello there")
        wait_idle(qtbot, w)

        user, reply = messages(w)
        expected = server.expected()
        assert (user.content, reply.state, reply.content) == ("Hello there", COMPLETE, REPLY)
        assert len(seen) >= 2 and all(a == b[: len(a)] for a, b in zip(seen, seen[1:]))  # it streamed
        assert reply.model == MODEL
        assert reply.stats["tokens"] == expected["tokens"]  # the usage's completion_tokens
        assert reply.stats["decode_tokens_per_second"] > 0 and reply.stats["ttft_seconds"] > 0
        assert reply.stats["mean_acceptance_length"] == pytest.approx(expected["tau"])
        assert reply.stats["acceptance_rate"] == pytest.approx(expected["rate"])
        assert w.spec.tau.text() == f"τ = {expected['tau']:.2f} tokens/step" == "τ = 2.75 tokens/step"
        assert w.spec.rate.text() == f"{expected['rate']:.0%}" == "44%"
        assert w.spec.counts.text() == f"{expected['accepted']} / {expected['drafted']}" == "21 / 48"
        assert list(w.spec.positions.bars.opts["height"]) == pytest.approx(expected["per_position"])
        assert "τ 2.75" in w.chat.widget(reply.id).footer.text()

        body = server.requests[-1]
        assert body["model"] == MODEL and body["stream"] and body["max_tokens"] == 200
        assert body["messages"] == [{"role": "user", "content": "Hello there"}]
        assert body["chat_template_kwargs"] == {"enable_thinking": False}

        # this computer's (fake) RTX 4090 is not shown as the engine's GPU
        t = w.telemetry
        assert t.hardware.title() == "GPU (remote)" and host in t.notice.text() and t.notice.isVisible()
        assert not t.values["gpu_name"].isVisible() and not t.values["power"].isVisible()
        assert t.text("gpu_name") == "n/a" and t.text("power") == "n/a"
        assert t.second_plot.title == REMOTE_PLOT_TITLE
        until(lambda: "tok/s (all requests)" in t.text("tps_server"))
        assert t.values["tps_server"].isVisible()

        # the choice is remembered: the next start chats with the server again
        w.close()
        again = open_remote(data_dir=tmp_path / "data")
        assert again.remote.state == "ready" and again.model_label.text() == f"{MODEL} · vLLM at {host}"
        assert again.setup.server_url.text() == server.url


def test_sglang_metrics_and_thinking(qtbot, open_remote) -> None:
    with FakeOpenAIServer("sglang") as server:
        w = open_remote(server)
        assert w.spec.length_note.text() == "set by SGLang"
        w.new_conversation()
        w.controller.update_settings(
            "", {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 300, "thinking": True}
        )
        send(qtbot, w, "Hi")
        wait_idle(qtbot, w)
        _user, reply = messages(w)
        expected = server.expected()
        assert (reply.state, reply.content, reply.thought) == (COMPLETE, REPLY, THOUGHT)
        assert reply.stats["tokens"] == expected["tokens"] + len(words(THOUGHT))
        assert server.requests[-1]["chat_template_kwargs"] == {"enable_thinking": True}
        # SGLang publishes the mean acceptance length and rate as gauges: no draft counts, no positions
        assert w.spec.tau.text() == "τ = 2.75 tokens/step" and w.spec.rate.text() == "44%"
        assert w.spec.counts.text() == "n/a" and list(w.spec.positions.bars.opts["height"]) == []


def test_a_server_without_metrics_shows_na(qtbot, open_remote) -> None:
    with FakeOpenAIServer(metrics=None) as server:
        w = open_remote(server)
        assert not w.spec.enabled.isChecked() and "publishes no /metrics" in w.spec.source.text()
        greedy(w, max_tokens=100)
        send(qtbot, w, "Hello")
        wait_idle(qtbot, w)
        _user, reply = messages(w)
        assert reply.state == COMPLETE and reply.content == REPLY
        assert reply.stats["mean_acceptance_length"] is None and reply.stats["decode_tokens_per_second"] > 0
        assert (w.spec.tau.text(), w.spec.rate.text(), w.spec.counts.text()) == ("τ n/a", "n/a", "n/a")
        assert w.telemetry.text("tps_server") == "n/a"


def test_a_wrong_key_says_so_and_loses_no_text(qtbot, open_remote) -> None:
    with FakeOpenAIServer("vllm", api_key="right-key") as server:
        w = open_remote(server, api_key="right-key")
        assert w.remote.state == "ready"

        w.setup.server_url.setText(server.url)
        w.setup.server_key.setText("wrong-key")
        w.setup.server_check_button.click()
        until(lambda: "HTTP 401" in w.setup.server_status.text())
        assert "refused the API key (HTTP 401: Unauthorized)" in w.setup.server_status.text()

        # the server's key changes while connected: the reply fails with the sentence, the message stays
        server.api_key = "rotated-key"
        greedy(w, max_tokens=50)
        send(qtbot, w, "Keep every word of this")
        wait_idle(qtbot, w)
        user, reply = messages(w)
        assert user.content == "Keep every word of this" and reply.state == FAILED
        assert "refused the API key (HTTP 401" in reply.stats["error"]
        assert "refused the API key" in w.crash_banner.label.text() and w.crash_banner.isVisible()
        assert "refused the API key" in w.chat.widget(reply.id).status.text()

        # Connect to no address: said on the page, and the connection in use stays
        w.setup.server_url.setText("  ")
        w.setup.server_connect_button.click()
        assert w.setup.server_status.text() == "Type the server's address, e.g. http://127.0.0.1:8000/v1."
        assert w.remote.state == "ready" and w.store.setting("remote")["base_url"] == server.url

        # Connect with the wrong key: not connected, and the window says why
        w.setup.server_url.setText(server.url)
        w.setup.server_connect_button.click()
        until(lambda: w.remote.state == "stopped", timeout_ms=CONNECT_MS)
        assert "refused the API key" in w.setup.server_status.text()
        assert w.engine_label.text().startswith("Not connected: The server at")
        assert not w.composer.can_send and w.crash_banner.button.text() == "Connect again"


def test_stop_closes_the_stream_and_keeps_the_text(qtbot, open_remote) -> None:
    long_reply = " ".join([REPLY] * 8)
    with FakeOpenAIServer("vllm", step_delay=0.05, reply=long_reply) as server:
        w = open_remote(server)
        greedy(w, max_tokens=2000)
        send(qtbot, w, "Tell me everything")
        until(lambda: w.controller.reply is not None and len(w.controller.reply.text) > 40, timeout_ms=CONNECT_MS)
        QTest.keyClick(w.chat, Qt.Key.Key_Escape)
        wait_idle(qtbot, w)
        until(lambda: server.aborted == 1)  # the server saw the client leave: the generation stops there
        _user, reply = messages(w)
        assert reply.state == CANCELLED and server.completed == 0
        assert 40 < len(reply.content) < len(long_reply) and long_reply.startswith(reply.content)


def test_switching_from_the_local_engine_to_a_server_and_back(qtbot, open_remote, tmp_path) -> None:
    from flashdesk.engine.hub.demo import create_demo

    target, draft = create_demo(tmp_path / "demo")
    demo = {
        "target": str(target),
        "draft": str(draft),
        "device": "cpu",
        "context": 4096,
        "kv_dtype": "auto",
        "dtype": "auto",
        "demo": True,
    }
    with FakeOpenAIServer("vllm") as server:
        w = open_remote(model_setting=demo)
        until(lambda: w.session.state == "ready", timeout_ms=LOAD_MS)
        assert w.spec.enabled.isEnabled() and w.demo_banner.isVisible()

        # Connect where nothing listens: the server is checked first, and the working engine stays
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
        w.setup.server_url.setText(dead)
        w.setup.server_connect_button.click()
        until(lambda: not w.setup.server_status.text().startswith("Checking"), timeout_ms=CONNECT_MS)
        assert w.session.state == "ready" and not w.engine.is_remote and w.store.setting("engine") != "remote"
        assert "Connecting" not in w.setup.server_status.text() and w.spec.enabled.isEnabled()

        w.setup.server_url.setText(server.url)
        w.setup.server_check_button.click()
        until(lambda: "serves" in w.setup.server_status.text())
        assert w.setup.server_status.text() == (
            f"vLLM at 127.0.0.1:{server.port} serves {MODEL}; its /metrics has speculative-decoding figures."
        )
        assert w.setup.server_model.currentText() == MODEL
        w.setup.server_connect_button.click()
        until(lambda: w.remote.state == "ready", timeout_ms=CONNECT_MS)
        until(lambda: w.session.state == "idle", timeout_ms=LOAD_MS)  # the local model's memory is freed
        assert w.engine_label.text().startswith(f"Connected: {MODEL}") and "Demo" not in w.model_label.text()
        assert not w.demo_banner.isVisible() and not w.spec.enabled.isEnabled() and not w.setup.local_button.isHidden()
        assert w.store.setting("engine") == "remote"
        greedy(w, max_tokens=100)
        send(qtbot, w, "From the server")
        wait_idle(qtbot, w)
        assert messages(w)[-1].content == REPLY and len(server.requests) == 1

        w.setup.local_button.click()  # back: the demo loads again, nothing of the server stays
        until(lambda: w.session.state == "ready", timeout_ms=LOAD_MS)
        assert w.remote.state == "stopped" and w.store.setting("engine") == "local"
        assert w.model_label.text().startswith("Demo model") and w.engine_label.text().startswith("Demo model ready")
        assert w.spec.enabled.isEnabled() and w.spec.length.isVisible() and not w.spec.source.isVisible()
        assert w.spec.histogram.isVisible() and w.spec.colour.isVisible()
        assert w.telemetry.hardware.title() == "GPU" and not w.telemetry.values["tps_server"].isVisible()
        greedy(w, max_tokens=8)
        send(qtbot, w, "From the local engine")
        wait_idle(qtbot, w)
        assert messages(w)[-1].state == COMPLETE and len(server.requests) == 1
