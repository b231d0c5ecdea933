"""The real window against the real engine process running the demo model (offscreen).

Each test opens a window on its own data folder, as a user would start the app; the worker is a
real `python -m flashdesk.engine.worker` process. FLASHDESK_WORKER_STEP_DELAY slows the tiny model
down so a test can act in the middle of a reply. The demo is a trained model that ends its replies
by itself; these tests set a reply's length with max_tokens, so their requests ignore the end of turn.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QAction
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from flashdesk import protocol as p
from flashdesk.app.backends.engine_session import EngineSession
from flashdesk.app.main_window import MainWindow
from flashdesk.app.history.store import CANCELLED, COMPLETE, INTERRUPTED, Store
from flashdesk.app.panels.telemetry import TelemetrySampler
from test_telemetry import NVMLError, fake_nvml, until

LOAD_MS = 90_000
REPLY_MS = 60_000


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, Path]:
    from flashdesk.engine.hub.demo import create_demo

    return create_demo(tmp_path_factory.mktemp("demo-model"))


@pytest.fixture
def open_window(qtbot, monkeypatch, tmp_path):
    """open_window(data_dir=None, demo=None, delay=None, nvml=None, context=4096) -> a shown MainWindow."""
    windows: list[MainWindow] = []
    # replies run to their max_tokens (the reply's length is a test's setup): the trained demo would
    # often end them sooner with its end-of-turn token
    monkeypatch.setattr(p, "Generate", functools.partial(p.Generate, ignore_eos=True))

    def make(
        data_dir: Path | None = None,
        demo=None,
        delay: float | None = None,
        nvml=None,
        wait: bool = True,
        context: int = 4096,
    ) -> MainWindow:
        data_dir = data_dir or tmp_path / "data"
        data_dir.mkdir(exist_ok=True)
        monkeypatch.setenv("FLASHDESK_DATA_DIR", str(data_dir))
        store = Store(data_dir / "flashdesk.db")
        if demo is not None:
            store.set_setting(
                "model",
                {
                    "target": str(demo[0]),
                    "draft": str(demo[1]),
                    "device": "cpu",
                    "context": context,
                    "kv_dtype": "auto",
                    "dtype": "auto",
                    "demo": True,
                },
            )
        session = EngineSession(env={"FLASHDESK_WORKER_STEP_DELAY": str(delay)} if delay else None)
        sampler = TelemetrySampler(
            nvml or fake_nvml(init_error=NVMLError("NVML Shared Library Not Found")), interval=0.2
        )
        window = MainWindow(store, session, sampler)
        qtbot.addWidget(window)
        window.show()
        window.activateWindow()
        QTest.qWaitForWindowActive(window)
        windows.append(window)
        if wait and store.setting("model"):
            until(lambda: session.state == "ready", timeout_ms=LOAD_MS)
        return window

    yield make
    for window in windows:
        window.close()
        window.store.close()


def greedy(window: MainWindow, max_tokens: int) -> None:
    """Start a conversation that decodes greedily (the same reply every time)."""
    window.new_conversation()
    window.controller.update_settings(
        "", {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": max_tokens, "thinking": False}
    )


def send(qtbot, window: MainWindow, text: str | None, typed: bool = True) -> None:
    """Type `text` (or paste it: typed=False; None: send what the box holds) and press Enter; return
    once the reply has started (the window counts the conversation's tokens first, a round trip to
    the engine)."""
    window.composer.edit.setFocus()
    if text is not None and typed:
        qtbot.keyClicks(window.composer.edit, text)
    elif text is not None:
        window.composer.edit.setPlainText(text)
    started: list = []

    def mark(message) -> None:
        started.append(message)

    window.controller.reply_started.connect(mark)
    try:
        qtbot.keyClick(window.composer.edit, Qt.Key.Key_Return)
        until(lambda: started, timeout_ms=10_000)
    finally:
        window.controller.reply_started.disconnect(mark)
    assert window.controller.busy or window.controller.reply is None, "Enter did not send"


def wait_idle(qtbot, window: MainWindow) -> None:
    until(lambda: not window.controller.busy, timeout_ms=REPLY_MS)


def messages(window: MainWindow):
    return window.store.messages(window.controller.conversation.id)


def test_send_streams_is_stored_while_streaming_and_survives_a_restart(qtbot, open_window, demo, tmp_path) -> None:
    w = open_window(demo=demo, delay=0.02)
    assert w.windowTitle() == "New conversation — FlashDesk"
    greedy(w, max_tokens=240)
    w.spec.length.setValue(3)  # four tokens a step at most: the reply takes a few saves
    seen: list[str] = []
    w.controller.reply_progress.connect(lambda r: seen.append(r.text))
    send(qtbot, w, "Hello there")
    assert w.composer.button.text() == "Stop (Esc)"

    db = sqlite3.connect(tmp_path / "data" / "flashdesk.db")
    partial = "SELECT content FROM messages WHERE role = 'assistant' AND state = 'streaming' AND content != ''"
    until(lambda: db.execute(partial).fetchone() is not None, timeout_ms=REPLY_MS)
    db.close()
    wait_idle(qtbot, w)

    assert len(seen) >= 3 and all(a == b[: len(a)] for a, b in zip(seen, seen[1:]))  # it streamed, growing
    user, reply = messages(w)
    assert (user.role, user.content, reply.role, reply.state) == ("user", "Hello there", "assistant", COMPLETE)
    assert reply.content == seen[-1] and reply.content.strip()
    assert reply.stats["tokens"] == 240 and reply.stats["decode_tokens_per_second"] > 0
    assert reply.stats["ttft_seconds"] > 0 and reply.stats["mean_acceptance_length"] >= 1
    widget = w.chat.widget(reply.id)
    assert widget.message.content == reply.content
    assert "240 tokens" in widget.footer.text() and "tok/s" in widget.footer.text()
    assert "J/token n/a" in widget.footer.text()  # CPU: no energy counter
    assert w.windowTitle() == "Hello there — FlashDesk"
    assert w.conversations.list.currentItem().text() == "Hello there"
    assert w.composer.button.text() == "Send"
    assert w.telemetry.text("tps_message").endswith("tok/s")
    assert w.spec.tau.text().endswith("tokens/step")
    w.close()

    again = open_window(delay=None)  # the same data folder, the model remembered
    assert [c.title for c in again.store.conversations()][:1] == ["Hello there"]
    assert again.windowTitle() == "Hello there — FlashDesk"
    stored = messages(again)
    assert [m.content for m in stored] == ["Hello there", reply.content]
    assert again.chat.widget(stored[1].id).message.content == reply.content
    assert again.spec.tau.text() == w.spec.tau.text()  # the last reply's statistics, from the store


def test_escape_stops_within_one_step(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo, delay=0.03)
    greedy(w, max_tokens=1000)
    finished = []
    w.session.finished.connect(finished.append)
    send(qtbot, w, "Count to a thousand")
    until(lambda: w.controller.reply is not None and w.controller.reply.tokens >= 5, timeout_ms=REPLY_MS)
    w.chat.setFocus()  # Esc works wherever the focus is, not only in the message box
    QTest.keyClick(w.chat, Qt.Key.Key_Escape)
    wait_idle(qtbot, w)
    assert QApplication.activeWindow() is w  # nothing flashed up as a window of its own meanwhile
    done = finished[-1]
    assert done.reason == "cancelled"
    assert done.cancel_step is not None and done.last_step <= done.cancel_step  # the step in flight, no more
    reply = messages(w)[-1]
    assert reply.state == CANCELLED and 0 < reply.stats["tokens"] < 1000
    assert reply.content == done.text
    assert w.chat.widget(reply.id).status.text() == "Stopped."


def test_speculation_changes_mid_reply_take_effect_and_change_nothing(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo, delay=0.02)
    greedy(w, max_tokens=140)
    finished, drafts = [], []
    w.session.finished.connect(finished.append)
    w.session.steps.connect(lambda steps: drafts.extend(len(s.draft) for s in steps if s.index > 0))

    w.spec.enabled.setChecked(False)
    send(qtbot, w, "Hello")
    wait_idle(qtbot, w)
    plain = finished[-1]
    assert set(drafts) == {0}

    drafts.clear()
    w.spec.enabled.setChecked(True)
    w.spec.length.setValue(3)
    w.regenerate_last()
    until(lambda: 3 in drafts, timeout_ms=REPLY_MS)
    w.spec.enabled.setChecked(False)
    mark = len(drafts)
    until(lambda: 0 in drafts[mark:], timeout_ms=REPLY_MS)
    w.spec.enabled.setChecked(True)
    w.spec.length.setValue(6)
    until(lambda: 6 in drafts, timeout_ms=REPLY_MS)
    wait_idle(qtbot, w)

    spec = finished[-1]
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    order = [n for i, n in enumerate(drafts) if i == 0 or n != drafts[i - 1]]
    assert order.index(3) < order.index(0) < order.index(6), order
    reply = messages(w)[-1]
    assert {3, 6} <= set(reply.stats["draft_lengths"]) and reply.stats["accepted"] > 0
    assert w.store.setting("speculation") == {"enabled": True, "draft_length": 6, "method": "dflash"}


def test_killed_worker_keeps_the_partial_reply_and_restarts(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo, delay=0.03)
    greedy(w, max_tokens=1000)
    send(qtbot, w, "Tell me a story")
    until(lambda: w.controller.reply is not None and w.controller.reply.tokens >= 8, timeout_ms=REPLY_MS)
    w.session.client.kill()
    until(w.crash_banner.isVisible, timeout_ms=REPLY_MS)
    assert not w.controller.busy
    text = w.crash_banner.label.text()
    assert "engine stopped" in text and "SIGKILL" in text and "kept" in text
    reply = messages(w)[-1]
    assert reply.state == INTERRUPTED and reply.content.strip()
    widget = w.chat.widget(reply.id)
    assert widget.message.content == reply.content and "Interrupted" in widget.status.text()
    assert not w.composer.button.isEnabled()
    assert "Restart engine" in w.composer.edit.placeholderText()  # named, wherever the banner is

    count = len(messages(w))  # Enter while the engine is down: said, offered the restart, text kept
    w.crash_banner.hide()
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "Second question")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    assert w.crash_banner.isVisible() and "kept in the box" in w.crash_banner.label.text()
    assert w.crash_banner.button.text() == "Restart engine"
    assert w.composer.edit.toPlainText() == "Second question" and len(messages(w)) == count

    qtbot.mouseClick(w.crash_banner.button, Qt.MouseButton.LeftButton)
    assert "stopped" not in w.composer.edit.placeholderText()  # nothing stale while it restarts
    assert "stopped" not in w.engine_label.text()
    until(lambda: w.session.state == "ready", timeout_ms=LOAD_MS)
    assert not w.crash_banner.isVisible()
    w.controller.update_settings("", {"temperature": 0.0, "max_tokens": 10})
    send(qtbot, w, None)  # the kept text
    wait_idle(qtbot, w)
    last = messages(w)
    assert [m.state for m in last[-2:]] == [COMPLETE, COMPLETE] and last[-1].stats["tokens"] == 10
    assert last[1].content == reply.content  # the interrupted reply is still there


def test_corrupt_database_is_moved_aside_and_reported(qtbot, open_window, tmp_path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "flashdesk.db").write_bytes(b"not sqlite" * 500)
    w = open_window(data_dir=data)
    assert w.notice_box is not None
    until(w.notice_box.isVisible, timeout_ms=5000)
    assert "moved" in w.notice_box.text()
    assert any(p.name.startswith("flashdesk.db.corrupt-") for p in data.iterdir())
    assert w.pages.currentIndex() == 0  # no model configured: the setup page


def test_first_run_demo_and_memory_plan(qtbot, open_window, tmp_path) -> None:
    w = open_window()
    assert w.pages.currentIndex() == 0 and w.windowTitle() == "FlashDesk"
    assert "toy" in w.setup.demo_text.text()
    w.session.ensure_started()  # as a first Check does
    until(lambda: w.session.state == "idle", timeout_ms=LOAD_MS)
    assert w.engine_label.text().startswith("No model loaded yet")  # no engine "again" on a first run
    assert "Restart" not in w.engine_label.text()
    qtbot.mouseClick(w.setup.demo_button, Qt.MouseButton.LeftButton)
    until(lambda: w.session.state == "ready", timeout_ms=LOAD_MS)
    assert (tmp_path / "data" / "demo" / "target" / "model.safetensors").is_file()
    assert w.pages.currentIndex() == 1
    assert w.demo_banner.isVisible() and "toy" in w.demo_banner.label.text()
    assert "Demo model" in w.model_label.text()
    assert w.spec.length.maximum() == 15 and w.spec.enabled.isEnabled()

    w.show_setup()
    assert w.setup.target.text().endswith("target")
    assert w.setup.status.text().startswith("Loaded: Demo model + DFlash on CPU")  # not the last step's "loaded"
    qtbot.mouseClick(w.setup.check_button, Qt.MouseButton.LeftButton)
    until(lambda: "memory" in w.setup.plan.toPlainText(), timeout_ms=LOAD_MS)
    plan = w.setup.plan.toPlainText()
    assert "drafter" in plan and "verdict    ok" in plan
    assert "of RAM on the CPU" in plan and "in RAM" in plan  # the demo runs on the CPU: the plan says so
    assert "GPU" not in plan and "fp8" not in plan and "--" not in plan  # and no command-line flags
    assert w.setup.status.text()
    w.setup.context.setValue(8192)  # the check spoke of other settings: it goes
    assert w.setup.plan.toPlainText() == "" and w.setup.status.text() == ""
    w.setup.target.setText(str(tmp_path / "nowhere"))
    qtbot.mouseClick(w.setup.check_button, Qt.MouseButton.LeftButton)
    until(lambda: "Not usable" in w.setup.status.text(), timeout_ms=LOAD_MS)


def test_conversations_edit_regenerate_export(qtbot, open_window, demo, tmp_path) -> None:
    w = open_window(demo=demo, nvml=fake_nvml())
    greedy(w, max_tokens=12)
    send(qtbot, w, "First question")
    wait_idle(qtbot, w)
    first_conv = w.controller.conversation.id
    user, reply = messages(w)

    # regenerate: the same greedy reply again, in a new message
    w.chat.widget(reply.id).regen_button.click()
    wait_idle(qtbot, w)
    user2, reply2 = messages(w)
    assert user2.id == user.id and reply2.id != reply.id and reply2.content == reply.content

    # edit and resend the user message: a new branch (the old one stays, see test_app_branches.py)
    widget = w.chat.widget(user.id)
    widget.edit_button.click()
    assert widget.editor.isVisible()
    assert widget.edit_note.text().startswith("Saving sends it as a new version. This version, with the 1 message")
    widget.editor.setPlainText("Second question")
    widget.edit_send.click()
    wait_idle(qtbot, w)
    got = messages(w)
    assert [m.content for m in got][0] == "Second question" and len(got) == 2 and got[1].state == COMPLETE
    assert got[1].content != reply.content

    # system prompt and sampling belong to the conversation
    w.edit_settings()
    dialog = w.settings_dialog
    dialog.system.setPlainText("Answer in French.")
    dialog.max_tokens.setValue(5)
    dialog.accept()
    assert w.controller.conversation.system_prompt == "Answer in French."
    assert w.controller.sampling()["max_tokens"] == 5

    # export
    w.export_to(tmp_path / "c.md", "md")
    w.export_to(tmp_path / "c.json", "json")
    md = (tmp_path / "c.md").read_text()
    assert md.startswith("# First question") and "Answer in French." in md and "Second question" in md
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["format"] == "flashdesk-conversation" and [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][1]["stats"]["tokens"] == 12

    # new, search, rename (F2), delete (Delete key)
    w.new_conversation()
    assert w.windowTitle() == "New conversation — FlashDesk"
    send(qtbot, w, "Pasta recipes")
    wait_idle(qtbot, w)
    assert [c.title for c in w.store.conversations()] == ["Pasta recipes", "First question"]
    qtbot.keyClicks(w.conversations.search, "pasta")
    assert w.conversations.list.count() == 1
    w.conversations.search.clear()
    item = w.conversations.list.currentItem()
    item.setText("Italian food")  # what the inline editor does on Enter after F2
    assert w.store.conversation(w.controller.conversation.id).title == "Italian food"
    assert w.windowTitle() == "Italian food — FlashDesk"
    w.conversations.confirm_delete = lambda title: True
    w.conversations.list.setFocus()
    QTest.keyClick(w.conversations.list, Qt.Key.Key_Delete)
    assert [c.title for c in w.store.conversations()] == ["First question"]
    assert w.controller.conversation.id == first_conv

    # the telemetry panel shows the fake card's fixed readings
    until(lambda: w.telemetry.text("power") == "288 W of 450 W", timeout_ms=5000)
    assert w.telemetry.text("gpu_name") == "NVIDIA GeForce RTX 4090"
    assert w.telemetry.text("worker_vram") == "0.00 GiB"  # the demo worker holds nothing on the GPU


def test_whitespace_cannot_be_sent(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo)
    w.new_conversation()
    assert not w.composer.button.isEnabled()  # nothing typed
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "   ")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(w.composer.edit, "\t ")
    assert not w.composer.button.isEnabled()
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    QTest.qWait(100)
    assert not w.controller.busy and (w.controller.conversation is None or messages(w) == [])
    assert w.composer.edit.toPlainText().strip() == ""
    qtbot.keyClicks(w.composer.edit, "hi")
    assert w.composer.button.isEnabled()


def test_an_error_banner_belongs_to_its_conversation(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo)
    greedy(w, max_tokens=4)
    send(qtbot, w, "First")
    wait_idle(qtbot, w)
    first = w.controller.conversation.id
    w.new_conversation()
    greedy(w, max_tokens=4)
    send(qtbot, w, "Second")
    wait_idle(qtbot, w)
    w.session.error.emit(p.Error(p.OUT_OF_MEMORY, "CUDA out of memory", during="generate"))
    assert w.crash_banner.isVisible() and "Out of memory" in w.crash_banner.label.text()
    w.controller.open(first)
    assert not w.crash_banner.isVisible()


def test_the_side_panel_collapses_and_is_remembered(qtbot, open_window, tmp_path) -> None:
    w = open_window()
    action = w.findChild(QAction, "sidePanelAction")
    assert action.isChecked() and not w.side.isHidden()
    action.trigger()
    assert not action.isChecked() and w.side.isHidden()
    w.close()
    again = open_window()  # the same data folder
    again.resize(1380, 860)  # (the kept size is fitted to the tests' 800x800 screen)
    assert again.side.isHidden() and not again.side_action.isChecked()
    again.side_action.trigger()
    assert not again.side.isHidden()


def test_a_narrow_window_gives_the_chat_the_room_and_says_how_to_get_the_panel_back(qtbot, open_window) -> None:
    w = open_window()
    w.show_chat()
    w.resize(900, 600)
    until(lambda: w.side.isHidden())
    assert "Ctrl+Shift+S" in w.statusBar().currentMessage() and not w.side_action.isChecked()
    assert w.store.setting("side_panel", True) is True  # the choice is not changed by the size
    w.side_action.trigger()  # asked for: it shows, narrow or not (over the chat)
    assert not w.side.isHidden() and w.side_action.isChecked() and w.width() == 900
    w.side_action.trigger()  # and hidden again there: the kept choice is still to show it where it fits
    assert w.side.isHidden() and w.store.setting("side_panel", True) is True
    w.side_action.trigger()
    w.resize(1400, 860)
    until(lambda: w.width() >= 1100)
    w.resize(900, 600)
    until(lambda: w.side.isHidden())  # narrow again after a wide spell: hidden again
    w.resize(1400, 860)
    until(lambda: not w.side.isHidden())


def test_the_hidden_side_panel_folds_to_a_strip_of_icons_and_the_chat_keeps_its_room(qtbot, open_window) -> None:
    w = open_window()
    w.show_chat()
    assert w.strip.isHidden() and not w.side.isHidden()  # the panel shows where it fits: no strip
    w.resize(900, 600)
    until(lambda: w.side.isHidden())
    until(lambda: w.strip.isVisible())
    until(lambda: w.chat.width() >= 560)  # the chat keeps its room, the strip beside it
    w.strip.buttons["telemetry"].click()  # an icon: the panel, at that part, over the chat
    assert not w.side.isHidden() and w.side.parentWidget() is w.pages  # a drawer, not a column
    qtbot.waitUntil(lambda: not w.telemetry.visibleRegion().isEmpty())
    qtbot.wait(50)
    assert w.width() == 900 and w.chat.width() >= 560  # the window keeps its size, the chat its width
    strip_left = w.strip.mapTo(w.pages, QPoint(0, 0)).x()
    assert w.strip.isVisible() and w.side.geometry().right() == strip_left - 1 and w.side.width() >= 340
    w.side_action.trigger()  # folded again
    assert w.side.isHidden() and w.strip.isVisible()
    w.strip.buttons["spec"].click()
    assert not w.side.isHidden() and w.esc.isEnabled()
    w.esc.activated.emit()  # Esc closes the drawer (and stops no reply)
    assert w.side.isHidden() and not w.esc.isEnabled()
    w.strip.buttons["spec"].click()
    w.strip.buttons[""].click()  # the strip's first icon closes it too
    assert w.side.isHidden()
    w.strip.buttons["server"].click()
    qtbot.waitUntil(lambda: not w.server_panel.visibleRegion().isEmpty())
    w.show_setup()  # the drawer is the chat page's
    assert w.side.isHidden()
    w.show_chat()
    assert not w.side.isHidden()
    w.resize(1400, 860)  # wide again: docked, as the kept choice says
    until(lambda: w.side.parentWidget() is w.splitter and not w.side.isHidden() and w.strip.isHidden())


def test_the_window_keeps_its_size_and_column_widths_for_the_next_start(qtbot, open_window) -> None:
    """(Within the tests' 800x800 offscreen screen: a kept geometry is fitted to the screen it opens on.)"""
    w = open_window()
    w.show_chat()
    w.resize(780, 700)
    until(lambda: w.height() == 700 and w.side.isHidden())
    w.splitter.setSizes([300, 480, 0])
    until(lambda: w.splitter.sizes()[0] == 300)
    size = w.size()
    w.strip.buttons["spec"].click()  # closed with the side panel open as a drawer: its column is kept too
    assert w.splitter.count() == 2
    w.close()
    again = open_window()  # the same data folder
    again.show_chat()
    until(lambda: again.size() == size)
    until(lambda: again.splitter.sizes()[0] == 300)
    kept = again.store.setting("window_layout")
    assert kept["splitter"][2] > 0  # the hidden side panel's width, kept for when it shows
    again.store.set_setting("window_layout", {"geometry": "not base64!", "splitter": [0, "x", 3]})
    from flashdesk.app import window_layout

    assert window_layout.restore(again.store, again, again.splitter) is False  # refused; nothing changes
    assert again.splitter.sizes()[0] == 300


def test_regenerate_keeps_the_earlier_replies_to_browse(qtbot, open_window, demo, tmp_path) -> None:
    w = open_window(demo=demo)
    greedy(w, max_tokens=6)
    send(qtbot, w, "Write a Python function")
    wait_idle(qtbot, w)
    _, first = messages(w)
    assert not w.chat.widget(first.id).versions_row.isVisibleTo(w.chat.widget(first.id))
    w.controller.update_settings("", {"temperature": 0.0, "max_tokens": 10})  # a longer second version
    w.chat.widget(first.id).regen_button.click()
    assert "Temperature 0 writes the same reply again" in w.statusBar().currentMessage()  # and where to change it
    wait_idle(qtbot, w)
    _, second = messages(w)
    assert second.id != first.id and second.content != first.content
    widget = w.chat.widget(second.id)
    assert widget.versions_row.isVisibleTo(widget) and widget.version_label.text() == "2/2"
    assert widget.older.isEnabled() and not widget.newer.isEnabled()

    qtbot.mouseClick(widget.older, Qt.MouseButton.LeftButton)  # back to the first: the next turn sees it
    shown = messages(w)[-1]
    assert shown.id == first.id and shown.content == first.content
    assert w.chat.widget(first.id).version_label.text() == "1/2" and w.chat.widget(second.id) is None
    assert w.controller.prompt_messages("Next")[-2:] == [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "Next"},
    ]
    w.export_to(tmp_path / "v.json", "json")
    w.export_to(tmp_path / "v.md", "md")
    reply = json.loads((tmp_path / "v.json").read_text())["messages"][1]
    assert reply["version"] == 1 and [v["content"] for v in reply["versions"]] == [first.content, second.content]
    assert "Version 1 of 2" in (tmp_path / "v.md").read_text()
    w.close()

    again = open_window()  # stored: the same choice after a restart
    widget = again.chat.widget(first.id)
    assert widget is not None and widget.version_label.text() == "1/2"
    qtbot.mouseClick(widget.newer, Qt.MouseButton.LeftButton)
    assert messages(again)[-1].id == second.id


def test_kernels_that_failed_their_self_test_are_named_after_the_load(qtbot, open_window) -> None:
    """A load on a card where some kernel families failed their self-test (they run on torch):
    the window says which, once, in the notice banner."""
    w = open_window()
    note = "moe runs on the slower torch path: it failed the kernel self-test on this card (replies stay correct)"
    w._loaded(
        p.Loaded(
            target="/m",
            draft=None,
            name="Gemma",
            device="cuda:0",
            device_name="RTX 4090",
            device_uuid=None,
            dtype="bfloat16",
            kv_dtype="fp8",
            context_limit=4096,
            block_size=None,
            memory_bytes=1,
            seconds=1.0,
            kernel_note=note,
        )
    )
    assert not w.notice_banner.isHidden() and w.notice_banner.label.text() == "M" + note[1:]


def test_help_copies_the_diagnostics_report(qtbot, open_window, tmp_path) -> None:
    """Help > Copy diagnostics runs `flashdesk doctor --report -` in a child process and puts its
    report on the clipboard (no torch in the window's process)."""
    from PySide6.QtGui import QGuiApplication

    w = open_window()
    QGuiApplication.clipboard().setText("")
    with qtbot.waitSignal(w.diagnostics.done, timeout=120_000) as done:
        w.findChild(QAction, "copyDiagnosticsAction").trigger()
    assert done.args[0] is True, done.args
    report = json.loads(QGuiApplication.clipboard().text())
    assert report["flashdesk"] and any(line.startswith("torch: ") for line in report["environment"])
    assert "errors" in report and "kernel_self_tests" in report


def test_the_method_selector_switches_between_the_drafter_and_the_assistant(
    qtbot, open_window, spec_pair, tmp_path
) -> None:
    """With a DFlash drafter and Gemma 4's MTP assistant loaded, the panel offers both (and auto), a
    reply drafts with the method picked, and its footer and figures name it."""
    from tiny_assistant import write_echo_assistant

    (target, drafter), reference = spec_pair[1], spec_pair[2]
    assistant = tmp_path / "assistant"
    write_echo_assistant(assistant, reference, seed=4)
    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / "flashdesk.db")
    model = {"target": str(target), "draft": str(drafter), "assistant": str(assistant), "device": "cpu"}
    store.set_setting("model", dict(model, context=4096, kv_dtype="auto", dtype="auto"))
    store.close()
    w = open_window(data_dir=data)
    assert w.session.info.methods == ["dflash", "mtp"]
    assert [w.spec.method.itemData(i) for i in range(w.spec.method.count())] == ["dflash", "mtp", "auto"]
    assert " + DFlash + MTP · " in w.model_label.text()
    greedy(w, max_tokens=24)
    methods = []
    w.session.steps.connect(lambda steps: methods.extend(s.method for s in steps if s.index > 0))
    w.spec.method.setCurrentIndex(1)
    assert w.store.setting("speculation")["method"] == "mtp"
    send(qtbot, w, "Hello")
    wait_idle(qtbot, w)
    assert set(methods) - {None} == {"mtp"}
    reply = messages(w)[-1]
    assert set(reply.stats["methods"]) == {"mtp"} and "(MTP)" in w.chat.widget(reply.id).footer.text()


def test_help_lists_the_shortcuts_says_what_flashdesk_is_and_the_theme_is_a_choice(qtbot, open_window) -> None:
    from PySide6.QtWidgets import QMessageBox

    from flashdesk.app import theme

    w = open_window()
    lines = dict(w.shortcut_lines())
    assert lines["Chat → Regenerate last reply"] == "Ctrl+R" and lines["View → Show the side panel"] == "Ctrl+Shift+S"
    assert lines["Chat → Stop"] == "Esc" and lines["Help → Keyboard shortcuts"] == "F1 or Ctrl+/"
    w.findChild(QAction, "shortcutsAction").trigger()
    w.findChild(QAction, "shortcutsAction").trigger()  # again: the same window, to the front
    assert len(w.findChildren(QMessageBox, "shortcutsBox")) == 1
    box = w.findChild(QMessageBox, "shortcutsBox")
    assert box.isVisible() and "Ctrl+Shift+S" in box.text()
    w.findChild(QAction, "aboutAction").trigger()
    assert "MTP assistant" in w.findChild(QMessageBox, "aboutBox").text()
    app = QApplication.instance()
    style, palette = app.style().name(), app.palette()  # the tests' own, for the tests after this one
    try:
        w.findChild(QAction, "theme_dark").trigger()
        assert theme.is_dark() and w.store.setting("theme") == "dark"
        assert w.findChild(QAction, "theme_dark").isChecked() and not w.findChild(QAction, "theme_light").isChecked()
        w.findChild(QAction, "theme_light").trigger()
        assert not theme.is_dark() and w.store.setting("theme") == "light"
    finally:
        theme.set_choice("system")
        app.setStyle(style)
        app.setPalette(palette)


def test_the_engine_menu_leads_to_the_api_server(qtbot, open_window) -> None:
    w = open_window()
    w.set_side_panel(False)
    w.findChild(QAction, "serverPanelAction").trigger()
    assert w.pages.currentIndex() == 1 and not w.side.isHidden()
    qtbot.waitUntil(lambda: not w.server_panel.visibleRegion().isEmpty())  # scrolled into view


def test_a_new_conversations_reply_length_leaves_the_context_room(qtbot, open_window, demo) -> None:
    """The default reply length is at most a quarter of the loaded context (the demo's 4,096: 1,024), so
    a small context is not filled in two turns; a conversation's own setting stays as it was set."""
    w = open_window(demo=demo)
    w.new_conversation()
    assert w.controller.sampling()["max_tokens"] == 1024
    w.controller.update_settings("", dict(w.controller.sampling(), temperature=0.5))  # the dialog keeps all
    assert "max_tokens" not in w.controller.conversation.sampling  # the default is not frozen into it
    w.controller.update_settings("", {"max_tokens": 3000})
    assert w.controller.sampling()["max_tokens"] == 3000


def test_a_turn_the_disk_cannot_take_is_not_sent_and_loses_nothing(qtbot, open_window, demo, monkeypatch) -> None:
    """The reply's first write fails (a full disk): nothing goes to the engine, the user message is
    taken back, the text returns to the box, and the notice says why; nothing is raised into Qt."""
    import sqlite3

    w = open_window(demo=demo)
    greedy(w, max_tokens=4)
    send(qtbot, w, "Saved fine")
    wait_idle(qtbot, w)
    before = [m.content for m in messages(w)]
    real = w.store.add_message

    def full_disk(conversation_id, role, *args, **kwargs):
        if role == "assistant":
            raise sqlite3.OperationalError("database or disk is full")
        return real(conversation_id, role, *args, **kwargs)

    monkeypatch.setattr(w.store, "add_message", full_disk)
    w.composer.edit.setPlainText("Not saved")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    until(w.notice_banner.isVisible, timeout_ms=5000)
    assert "Not sent" in w.notice_banner.label.text() and "disk is full" in w.notice_banner.label.text()
    assert [m.content for m in messages(w)] == before and not w.controller.busy
    assert w.composer.edit.toPlainText() == "Not saved" and len(w.chat.widgets) == len(before)
