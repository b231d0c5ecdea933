"""Search in the window (issue 11 item 5): opening a result shows its message, scrolled to and marked.

A long conversation whose one matching message sits far above the end: the chat would otherwise
open at the end, where the hit is out of sight.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt

from flashdesk.app.chat.conversation_list import HIT_ROLE
from flashdesk.app.backends.engine_session import EngineSession
from flashdesk.app.main_window import MainWindow
from flashdesk.app.history.store import Store
from flashdesk.app.panels.telemetry import TelemetrySampler
from test_telemetry import NVMLError, fake_nvml, until


def _window(qtbot, monkeypatch, tmp_path, fill) -> MainWindow:
    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    store = Store(tmp_path / "flashdesk.db")
    fill(store)
    sampler = TelemetrySampler(fake_nvml(init_error=NVMLError("NVML Shared Library Not Found")), interval=0.2)
    window = MainWindow(store, EngineSession(), sampler)
    qtbot.addWidget(window)
    window.resize(1200, 700)
    window.show()
    window.show_chat()  # no model yet: the window opens on its setup page
    return window


def _in_view(window: MainWindow, message_id: int) -> bool:
    widget = window.chat.widget(message_id)
    if not widget.isVisible() or widget.height() == 0:  # not laid out yet
        return False
    top = widget.mapTo(window.chat.viewport(), QPoint(0, 0)).y()
    return top >= 0 and top + min(widget.height(), 40) <= window.chat.viewport().height()


def test_opening_a_search_result_scrolls_to_its_message_and_marks_it(qtbot, monkeypatch, tmp_path) -> None:
    ids = {}

    def fill(store: Store) -> None:
        conv = store.create_conversation("Long talk")
        for i in range(30):
            role = "user" if i % 2 == 0 else "assistant"
            text = "What about the striped zebra?" if i == 6 else f"Message number {i}. " + "Filler text. " * 30
            message = store.add_message(conv.id, role, text)
            if i == 6:
                ids["hit"] = message.id
            ids["last"] = message.id
        store.create_conversation("Other")

    window = _window(qtbot, monkeypatch, tmp_path, fill)
    try:
        window.conversations.search.setText("zebra")
        until(lambda: window.conversations.list.count() == 1)
        item = window.conversations.list.item(0)
        assert item.data(HIT_ROLE) == ids["hit"]
        rect = window.conversations.list.visualItemRect(item)
        qtbot.mouseClick(window.conversations.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        until(lambda: window.chat.widget(ids["hit"]) is not None)
        until(lambda: _in_view(window, ids["hit"]), timeout_ms=3000)
        assert not _in_view(window, ids["last"])  # not the end, where a conversation opens otherwise
        assert window.chat.widget(ids["hit"]).property("marked") is True
        assert len(window.chat.widget(ids["hit"]).body.extraSelections()) == 1  # "zebra", highlighted
        until(lambda: not window.chat.widget(ids["hit"]).property("marked"), timeout_ms=5000)

        # clicked again after scrolling away (the conversation already open): shown again
        bar = window.chat.verticalScrollBar()
        bar.setValue(bar.maximum())
        until(lambda: not _in_view(window, ids["hit"]))
        item = window.conversations.list.item(0)
        qtbot.mouseClick(
            window.conversations.list.viewport(),
            Qt.MouseButton.LeftButton,
            pos=window.conversations.list.visualItemRect(item).center(),
        )
        until(lambda: _in_view(window, ids["hit"]), timeout_ms=3000)
    finally:
        window.close()
        window.store.close()


def test_a_title_match_opens_the_conversation_at_its_end(qtbot, monkeypatch, tmp_path) -> None:
    ids = {}

    def fill(store: Store) -> None:
        conv = store.create_conversation("Zebra facts")
        for i in range(20):
            ids["last"] = store.add_message(
                conv.id, "user" if i % 2 == 0 else "assistant", f"Line {i}. " + "Words. " * 40
            ).id

    window = _window(qtbot, monkeypatch, tmp_path, fill)
    try:
        window.conversations.search.setText("zebra")
        until(lambda: window.conversations.list.count() == 1)
        item = window.conversations.list.item(0)
        assert item.data(HIT_ROLE) is None  # the title matched, no message to show
        qtbot.mouseClick(
            window.conversations.list.viewport(),
            Qt.MouseButton.LeftButton,
            pos=window.conversations.list.visualItemRect(item).center(),
        )
        until(lambda: window.chat.widget(ids["last"]) is not None)
        until(lambda: _in_view(window, ids["last"]), timeout_ms=3000)
    finally:
        window.close()
        window.store.close()
