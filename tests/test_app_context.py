"""The window and the context (issue 9, items 3 and 5), against the real engine process on the demo model.

A follow-up reuses the prompt prefix the engine already holds, so its first token does not wait for
the whole conversation to be prefilled again; the message box counts the conversation's tokens as
you type; a send past the context is warned about and then dropped to fit (or refused, as the
conversation's setting says, losing nothing); a reply the full context cut off offers the ways on.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import Qt

from flashdesk import protocol as p
from flashdesk.app.chat.context_gauge import NEAR, OK, OVER
from flashdesk.app.chat.context_flow import CANCEL, CONTINUE_REPLY, DROP_AND_SEND, NEW_LIKE, SEND_ANYWAY, TRIM
from flashdesk.app.chat.message_widget import CONTEXT_FULL_TEXT
from flashdesk.app.history.store import COMPLETE
from test_app_window import REPLY_MS, demo, greedy, messages, open_window, send, wait_idle  # noqa: F401
from test_telemetry import until


def _settings(window, **changes) -> None:
    conv = window.controller.conversation
    window.controller.update_settings(conv.system_prompt, {**window.controller.sampling(), **changes})


def _long_message(turn: int, sentences: int = 11) -> str:
    """About 40 tokens a sentence with the demo tokenizer."""
    return f"Turn {turn}. " + " ".join(
        f"The harbour log, entry {turn}-{j}: wind from the north-west, a falling tide, cargo of salt noted."
        for j in range(sentences)
    )


def _gauge_tokens(window) -> int:
    return int(window.composer.gauge.text().split(" / ")[0].replace(",", ""))


def _record(window) -> tuple[list, list]:
    started, finished = [], []
    window.session.started.connect(started.append)
    window.session.finished.connect(finished.append)
    return started, finished


# -- the done-when: a follow-up's first token does not wait for the whole conversation ----------------

ROUNDS = 7


def _follow_up(turn: int) -> str:
    return f"And what about entry {turn}?"


def _conversation(qtbot, window, reuse: bool) -> list[dict]:
    """ROUNDS rounds of a long message (~200 tokens: the conversation grows) and then a short
    follow-up question; per follow-up what the engine and the window measured."""
    window.controller.reuse = reuse
    greedy(window, max_tokens=4)
    started, finished = _record(window)
    rows = []
    for turn in range(ROUNDS):
        for text in (_long_message(turn, sentences=5), _follow_up(turn)):
            send(qtbot, window, text, typed=False)
            wait_idle(qtbot, window)
        s, f = started[-1], finished[-1]
        reply = messages(window)[-1]
        assert reply.state == COMPLETE and s.request_id == f.request_id
        rows.append(
            {
                "prompt": s.prompt_tokens,
                "reused": s.reused_tokens,
                "prefilled": f.stats["prefill_tokens"],
                "prefill_s": f.prefill_seconds,
                "ttft_s": reply.stats["ttft_seconds"],
                "footer": window.chat.widget(reply.id).footer.text(),
            }
        )
    return rows


def test_a_follow_up_prefills_only_its_new_tokens_as_the_conversation_grows(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo)
    reuse = _conversation(qtbot, w, reuse=True)
    control = _conversation(qtbot, w, reuse=False)  # the same conversation, prefilled from scratch each turn
    # the times are printed to read (pytest -s), not asserted: a busy machine moves them; what
    # keeps the time to first token flat is the prefill's length, asserted below
    for name, rows in (("reuse", reuse), ("no reuse", control)):
        print(f"\n{name}:", file=sys.stderr)
        for i, r in enumerate(rows):
            print(
                f"  follow-up {i}: prompt {r['prompt']:5d}  reused {r['reused']:5d}  prefilled {r['prefilled']:5d}  "
                f"prefill {r['prefill_s'] * 1000:6.0f} ms  first token {r['ttft_s'] * 1000:6.0f} ms",
                file=sys.stderr,
            )

    first, last = reuse[0], reuse[-1]
    assert last["prompt"] >= 5 * first["prompt"]  # the conversation grew several-fold...
    for r in reuse:  # ...while each follow-up prefilled only the last reply and its own question
        assert r["reused"] > 0 and r["prefilled"] == r["prompt"] - r["reused"]
        assert r["prefilled"] <= 48, r
        assert f"reused {r['reused']} of {r['prompt']} prompt tokens" in r["footer"]
    for r in control:  # the control prefilled the whole, growing conversation every time
        assert r["reused"] == 0 and r["prefilled"] == r["prompt"]
    assert [r["prompt"] for r in control] == [r["prompt"] for r in reuse]


# -- the gauge, and a send past the context ---------------------------------------------------------------


def test_gauge_counts_as_you_type_and_a_send_past_the_limit_warns_then_drops_the_oldest(
    qtbot, open_window, demo
) -> None:
    w = open_window(demo=demo, context=512)
    greedy(w, max_tokens=16)  # the reply keeps 16 tokens: a prompt may take 496
    w.controller.update_settings("Be brief.", w.controller.sampling())
    until(w.composer.gauge.isVisible, timeout_ms=5000)
    empty = _gauge_tokens(w)
    assert w.composer.gauge.text().endswith(" / 512 tokens") and w.composer.gauge_level == OK

    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "Hello")
    until(lambda: _gauge_tokens(w) > empty, timeout_ms=5000)
    hello = _gauge_tokens(w)
    qtbot.keyClicks(w.composer.edit, " there, how is the weather at sea today?")
    until(lambda: _gauge_tokens(w) > hello, timeout_ms=5000)
    assert "of a context of 512" in w.composer.gauge.toolTip()
    w.composer.edit.clear()

    for turn in range(2):
        send(qtbot, w, _long_message(turn, sentences=3), typed=False)
        wait_idle(qtbot, w)
    before = messages(w)
    assert len(before) == 4
    levels = []
    for sentences in range(1, 8):  # the gauge's colour as the message grows: ok, near, over
        text = _long_message(2, sentences)
        w.composer.edit.setPlainText(text)
        until(lambda: w.gauge.last is not None and w.gauge.last.messages[-1]["content"] == text, timeout_ms=5000)
        levels.append(w.composer.gauge_level)
    assert levels == sorted(levels, key=[OK, NEAR, OVER].index) and {NEAR, OVER} <= set(levels), levels
    assert _gauge_tokens(w) > 496

    # Enter warns first; nothing is sent, the text stays
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    until(w.context_banner.isVisible, timeout_ms=5000)
    banner = w.context_banner
    assert "oldest turns will be left out" in banner.label.text()
    assert (banner.button.text(), banner.button2.text()) == (SEND_ANYWAY, CANCEL)
    assert not w.controller.busy and len(messages(w)) == 4
    assert w.composer.edit.toPlainText() == _long_message(2, sentences=7)
    banner.button2.click()  # Cancel
    assert not banner.isVisible() and w.composer.edit.toPlainText() == _long_message(2, sentences=7)

    started, _finished = _record(w)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    until(w.context_banner.isVisible, timeout_ms=5000)
    banner.button.click()  # Send anyway
    assert w.controller.busy and w.composer.edit.toPlainText() == ""
    wait_idle(qtbot, w)
    assert started[-1].dropped_messages >= 2 and started[-1].prompt_tokens <= 496
    after = messages(w)
    assert [m.content for m in after[:4]] == [m.content for m in before]  # the conversation keeps everything
    assert after[4].content == _long_message(2, sentences=7) and after[5].state == COMPLETE
    note = w.chat.widget(after[5].id).note
    assert note.isVisible() and f"{started[-1].dropped_messages} oldest messages were left out" in note.text()
    assert after[5].stats["dropped_messages"] == started[-1].dropped_messages

    # the gauge counts what the prompt holds now, not the messages the engine already leaves out
    until(lambda: w.gauge.last is not None and w.gauge.last.left_out == after[5].stats["dropped_messages"])
    assert w.composer.gauge_level != OVER and "already left out" in w.composer.gauge.toolTip()

    # the oldest turns are being left out now: a send past the context goes without asking again
    text = _long_message(3, sentences=7)
    w.composer.edit.setPlainText(text)
    until(lambda: w.gauge.last is not None and w.gauge.last.messages[-1]["content"] == text, timeout_ms=5000)
    assert w.gauge.last.over
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    until(lambda: len(messages(w)) == 8, timeout_ms=5000)
    assert not w.context_banner.isVisible()
    wait_idle(qtbot, w)


def test_the_gauge_is_live_while_a_reply_streams(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo, context=512)
    greedy(w, max_tokens=48)
    until(w.composer.gauge.isVisible, timeout_ms=5000)
    counts, shown = [], []
    w.gauge.changed.connect(lambda count: count is not None and count.live and counts.append(count.tokens))
    w.controller.reply_progress.connect(lambda _reply: shown.append(w.composer.gauge.text()))
    send(qtbot, w, "Tell me about the harbour", typed=False)
    wait_idle(qtbot, w)
    reply = messages(w)[-1]
    assert len(counts) >= 3 and counts == sorted(counts)  # it grows with the reply
    assert counts[-1] == reply.stats["prompt_tokens"] + reply.stats["tokens"]
    assert len(set(shown)) >= 3  # and the message box shows it as it grows
    until(lambda: w.gauge.last is not None and w.gauge.last.messages and not w.gauge.last.live, timeout_ms=5000)


def test_a_message_too_long_by_itself_says_so_and_offers_no_dead_end(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo, context=512)
    greedy(w, max_tokens=16)
    before = [c.title for c in w.store.conversations()]
    text = _long_message(0, sentences=20)  # about 800 tokens, alone in a 512-token context
    w.composer.edit.setPlainText(text)
    until(lambda: w.gauge.last is not None and w.gauge.last.messages[-1]["content"] == text, timeout_ms=5000)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    until(w.context_banner.isVisible, timeout_ms=5000)
    banner = w.context_banner
    assert "too long for the context by itself" in banner.label.text() and "no older turns" in banner.label.text()
    assert (banner.button.text(), banner.button2.text()) == (TRIM, CANCEL)  # no "Send anyway" into a refusal
    assert w.composer.edit.toPlainText() == text and not w.controller.busy
    assert [c.title for c in w.store.conversations()] == before  # nothing named after what was not sent
    w.composer.edit.clear()
    assert not banner.isVisible()  # the warning was about the text in the box

    # trimmed to fit: its start stays in the box, the gauge says it fits, and Enter sends it
    w.composer.edit.setPlainText(text)
    until(lambda: w.gauge.last is not None and w.gauge.last.messages[-1]["content"] == text, timeout_ms=5000)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    until(w.context_banner.isVisible, timeout_ms=5000)
    banner.button.click()
    kept = w.composer.edit.toPlainText()
    assert not banner.isVisible() and 0 < len(kept) < len(text) and text.startswith(kept)
    assert "Trimmed to its first" in w.statusBar().currentMessage() and "Ctrl+Z" in w.statusBar().currentMessage()
    w.composer.edit.undo()  # as the status bar says: the rest comes back
    assert w.composer.edit.toPlainText() == text
    w.composer.edit.redo()
    assert w.composer.edit.toPlainText() == kept
    until(lambda: w.gauge.last is not None and w.gauge.last.messages[-1]["content"] == kept, timeout_ms=5000)
    assert not w.gauge.last.over
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    wait_idle(qtbot, w)
    assert [m.content for m in messages(w)][:1] == [kept] and messages(w)[-1].state == COMPLETE
    w.controller.new_conversation()

    # in a conversation with older turns: leaving them out would not help either, and it is said before
    # the send, not after a refusal (no "Send anyway")
    send(qtbot, w, "A short question first", typed=False)
    wait_idle(qtbot, w)
    count = len(messages(w))
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    until(w.context_banner.isVisible, timeout_ms=5000)
    assert "too long for the context by itself" in banner.label.text()
    assert "leaving the older turns out would not make room" in banner.label.text()
    assert (banner.button.text(), banner.button2.text()) == (TRIM, CANCEL)
    assert len(messages(w)) == count and not w.controller.busy
    banner.button.click()
    assert 0 < len(w.composer.edit.toPlainText()) < len(text)
    w.composer.edit.clear()
    w.controller.new_conversation()

    # sent regardless (as a stale count could): refused, and the conversation is not named after it
    from flashdesk.app.chat.chat_controller import NEW_TITLE

    assert w.controller.send(text)
    wait_idle(qtbot, w)
    assert messages(w) == [] and w.controller.conversation.title == NEW_TITLE
    assert "Not sent." in banner.label.text() and w.composer.edit.toPlainText() == text


# -- a reply that filled the context ----------------------------------------------------------------------


def test_a_reply_that_filled_the_context_offers_the_ways_on(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo, context=256)
    greedy(w, max_tokens=1000)  # capped to what the context leaves: the greedy demo never stops by itself
    w.controller.update_settings("Be brief.", w.controller.sampling())
    started, finished = _record(w)
    send(qtbot, w, "Tell me everything")
    wait_idle(qtbot, w)
    assert finished[-1].reason == "context"
    assert started[-1].max_tokens == 256 - started[-1].prompt_tokens < 1000
    reply = messages(w)[-1]
    widget = w.chat.widget(reply.id)
    assert CONTEXT_FULL_TEXT in widget.note.text() and widget.note.isVisible()
    assert "capped by the context" in widget.footer.text()
    banner = w.context_banner
    assert banner.isVisible() and "context filled up" in banner.label.text()
    assert (banner.button.text(), banner.button2.text()) == (CONTINUE_REPLY, NEW_LIKE)

    # go on: the same reply is written on (no "Continue." message), its start left out of the prompt
    first = reply.content
    banner.button.click()
    assert w.controller.busy and not banner.isVisible()
    wait_idle(qtbot, w)
    assert started[-1].dropped_messages == 0 and started[-1].cut_chars > 0  # the question stays
    assert started[-1].prompt_tokens <= (256 - 64) // 2 + 8  # down to about half of what fits
    got = messages(w)
    assert [m.role for m in got] == ["user", "assistant"] and got[1].id == reply.id
    assert got[1].state == COMPLETE and got[1].content.startswith(first.rstrip())
    assert len(got[1].content) > len(first.rstrip()) and len(w.chat.widgets) == 2
    stats = got[1].stats  # the whole reply's token count; its origins cover all of its text
    assert stats["continued"] and stats["tokens"] == reply.stats["tokens"] + len(finished[-1].token_ids)
    assert sum(n for n, _origin in stats["origins"]) == len(got[1].content)
    assert w.chat.widget(reply.id).message.content == got[1].content
    note = w.chat.widget(got[1].id).note.text()
    assert f"first {started[-1].cut_chars:,} characters of this reply were left out" in note

    # a new conversation carrying the system prompt and the settings; the message box keeps its text
    assert banner.isVisible()  # the continuation filled the context again
    old = w.controller.conversation
    w.composer.edit.setPlainText("half-written question")
    banner.button2.click()
    new = w.controller.conversation
    assert new.id != old.id and new.system_prompt == "Be brief." and new.sampling == old.sampling
    assert messages(w) == [] and w.composer.edit.toPlainText() == "half-written question"
    assert not banner.isVisible()
    send(qtbot, w, None)  # Enter sends what the box holds
    wait_idle(qtbot, w)
    assert [m.content for m in messages(w)][:1] == ["half-written question"]


# -- "stop and tell me" ------------------------------------------------------------------------------------


def test_stop_policy_warns_and_a_refused_turn_loses_nothing(qtbot, open_window, demo) -> None:
    w = open_window(demo=demo, context=256)
    greedy(w, max_tokens=16)
    w.controller.update_settings("Be brief.", w.controller.sampling())
    _settings(w, context_policy="stop")
    send(qtbot, w, _long_message(0, sentences=3), typed=False)
    wait_idle(qtbot, w)
    long = _long_message(1, sentences=3)

    # Enter: the warning says the turn would be refused, and offers the ways on
    w.composer.edit.setPlainText(long)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    until(w.context_banner.isVisible, timeout_ms=5000)
    banner = w.context_banner
    assert "refuse" in banner.label.text()
    assert (banner.button.text(), banner.button2.text()) == (DROP_AND_SEND, NEW_LIKE)
    assert len(messages(w)) == 2 and w.composer.edit.toPlainText() == long

    # sent regardless (as a stale count could): the engine refuses, the turn is taken back, the text kept
    errors = []
    w.session.error.connect(errors.append)
    assert w.controller.send(w.composer.edit.toPlainText())
    w.composer.edit.clear()
    wait_idle(qtbot, w)
    assert errors and errors[-1].kind == p.BAD_INPUT and errors[-1].during == "generate"
    assert len(messages(w)) == 2 and len(w.chat.widgets) == 2  # nothing half-sent stays behind
    assert w.composer.edit.toPlainText() == long
    assert banner.isVisible() and "Not sent." in banner.label.text() and "context" in banner.label.text()
    assert not w.crash_banner.isVisible()
    assert (banner.button.text(), banner.button2.text()) == (NEW_LIKE, DROP_AND_SEND)

    # drop the oldest turns this once: it goes, and the conversation's setting stays "stop"
    started, _ = _record(w)
    banner.button2.click()
    wait_idle(qtbot, w)
    assert started[-1].dropped_messages == 2 and messages(w)[-1].state == COMPLETE
    assert w.controller.sampling()["context_policy"] == "stop"
