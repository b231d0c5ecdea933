"""Branches instead of loss (issue 33, item 5), in the real window on the demo model: editing an earlier
message or regenerating a reply in the middle keeps the old branch, reachable with ‹ ›; search reads
every branch and opening a hit in one not shown switches to it; export writes the branch shown.
"""

from __future__ import annotations

import json

from PySide6.QtCore import Qt

from flashdesk.app.chat.conversation_list import HIT_ROLE
from test_app_window import demo, greedy, messages, open_window, send, wait_idle  # noqa: F401 - fixtures, helpers
from test_telemetry import until


def _click(qtbot, button) -> None:
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def test_an_edit_and_a_regenerate_keep_the_old_branch_to_go_back_to(qtbot, open_window, demo, tmp_path) -> None:
    w = open_window(demo=demo)
    greedy(w, max_tokens=6)
    send(qtbot, w, "Tell me about zebras")
    wait_idle(qtbot, w)
    send(qtbot, w, "And the okapi?")
    wait_idle(qtbot, w)
    old = messages(w)
    question, answer, okapi, okapi_reply = old

    widget = w.chat.widget(okapi.id)  # edit the second question: a new branch from there
    assert not widget.versions_row.isVisibleTo(widget)
    widget.edit_button.click()
    assert "new version" in widget.edit_note.text() and "‹ ›" in widget.edit_note.text()
    assert "replaced" not in widget.edit_note.text()
    widget.editor.setPlainText("And the lion?")
    widget.edit_send.click()
    wait_idle(qtbot, w)
    new = messages(w)
    assert [m.id for m in new[:2]] == [question.id, answer.id] and len(new) == 4
    lion, lion_reply = new[2:]
    assert lion.content == "And the lion?" and lion_reply.id != okapi_reply.id
    assert w.chat.widget(okapi.id) is None and w.chat.widget(okapi_reply.id) is None
    widget = w.chat.widget(lion.id)
    assert widget.versions_row.isVisibleTo(widget) and widget.version_label.text() == "2/2"
    assert widget.older.isEnabled() and not widget.newer.isEnabled()
    assert [m["content"] for m in w.controller.prompt_messages("Next")] == [
        question.content,
        answer.content,
        "And the lion?",
        lion_reply.content,
        "Next",
    ]

    _click(qtbot, widget.older)  # the old branch, with the reply that followed it
    assert [m.id for m in messages(w)] == [m.id for m in old]
    assert w.chat.widget(okapi_reply.id) is not None and w.chat.widget(lion.id) is None
    assert w.chat.widget(okapi.id).version_label.text() == "1/2"
    _click(qtbot, w.chat.widget(okapi.id).newer)
    assert [m.id for m in messages(w)] == [m.id for m in new]

    # search finds the old branch's words; opening the hit switches the conversation to that branch
    w.conversations.search.setText("okapi")
    until(lambda: w.conversations.list.count() == 1)
    item = w.conversations.list.item(0)
    assert item.data(HIT_ROLE) == okapi.id
    qtbot.mouseClick(
        w.conversations.list.viewport(),
        Qt.MouseButton.LeftButton,
        pos=w.conversations.list.visualItemRect(item).center(),
    )
    until(lambda: w.chat.widget(okapi.id) is not None)
    assert [m.id for m in messages(w)] == [m.id for m in old]
    assert w.chat.widget(okapi.id).property("marked") is True

    # export writes the branch shown, not the other one
    w.export_to(tmp_path / "b.json", "json")
    w.export_to(tmp_path / "b.md", "md")
    rows = json.loads((tmp_path / "b.json").read_text())["messages"]
    assert [r["content"] for r in rows] == [m.content for m in old]
    assert all("versions" not in r for r in rows)
    assert "okapi" in (tmp_path / "b.md").read_text() and "lion" not in (tmp_path / "b.md").read_text()

    # regenerate the reply in the middle: what followed it stays with the old version
    w.conversations.search.setText("")
    w.chat.widget(answer.id).regen_button.click()
    wait_idle(qtbot, w)
    again = messages(w)
    assert [m.id for m in again[:1]] == [question.id] and len(again) == 2 and again[1].id != answer.id
    widget = w.chat.widget(again[1].id)
    assert widget.version_label.text() == "2/2"
    _click(qtbot, widget.older)
    assert [m.id for m in messages(w)] == [m.id for m in old]


def test_an_edit_the_engine_refuses_is_taken_back_and_the_old_branch_shows_again(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo, context=256)
    greedy(w, max_tokens=8)
    w.controller.update_settings("", {**w.controller.sampling(), "context_policy": "stop"})
    send(qtbot, w, "A short question")
    wait_idle(qtbot, w)
    old = messages(w)
    refused: list[tuple] = []
    w.controller.edit_refused.connect(lambda message_id, text, _reason: refused.append((message_id, text)))
    w.composer.edit.setPlainText("a draft of the next question")
    long = "The harbour log. " + " ".join(
        f"Entry {j}: wind from the north-west, a falling tide, cargo of salt noted." for j in range(24)
    )

    widget = w.chat.widget(old[0].id)
    widget.edit_button.click()
    widget.editor.setPlainText(long)
    widget.edit_send.click()
    wait_idle(qtbot, w)
    assert refused == [(old[0].id, long)]  # the engine refused the edited turn: its text comes back, nothing is lost
    shown = messages(w)
    assert [m.id for m in shown] == [m.id for m in old] and shown[0].versions == 1
    assert set(w.chat.widgets) == {m.id for m in old}
    assert not w.chat.widget(old[0].id).versions_row.isVisibleTo(w.chat.widget(old[0].id))
    editor = w.chat.widget(old[0].id).editor  # back in the editor it came from; the draft in the box stays
    assert editor.isVisibleTo(w.chat.widget(old[0].id)) and editor.toPlainText() == long
    assert w.composer.edit.toPlainText() == "a draft of the next question"
    assert "Not sent." in w.context_banner.label.text() and "back in its editor" in w.context_banner.label.text()
