"""The window's parts on their own: Markdown and copy links, the message box keys, a message with its
thought, colour by origin, the reply's statistics, the speculation panel, export, theme."""

from __future__ import annotations

import json
import time

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QGuiApplication

from flashdesk import protocol as p
from flashdesk.app.chat.markdown import code_blocks, with_copy_links
from flashdesk.app.chat.reply import Reply, footer_text
from flashdesk.app.history.store import COMPLETE, INTERRUPTED, Conversation, Message

MD = "Intro\n\n```python\nprint('hi')\n```\n\nMiddle\n\n~~~\nraw ``` inside\n~~~\n\n```js\nunclosed();"


def test_code_blocks_and_copy_links() -> None:
    blocks = code_blocks(MD)
    assert [code for *_, code in blocks] == ["print('hi')", "raw ``` inside", "unclosed();"]
    rendered, code = with_copy_links(MD)
    assert code == ["print('hi')", "raw ``` inside", "unclosed();"]
    assert rendered.count("](copy:") == 3 and "[Copy code](copy:0)" in rendered
    assert with_copy_links("no code") == ("no code", [])


def _message(role: str = "assistant", content: str = "", **kw) -> Message:
    return Message(kw.pop("id", 1), 1, role, content, kw.pop("state", COMPLETE), time.time(), time.time(), **kw)


def test_message_thought_is_collapsible_with_its_duration(qtbot) -> None:
    from flashdesk.app.chat.message_widget import MessageWidget

    w = MessageWidget(_message(content="**Answer**", thought="Let me think about it.", thought_seconds=2.46))
    qtbot.addWidget(w)
    w.show()
    assert w.thought_toggle.isVisible() and w.thought_toggle.text() == "▸ Thought for 2.5 s"
    assert not w.thought_view.isVisible()
    w.thought_toggle.click()
    assert w.thought_view.isVisible() and "Let me think" in w.thought_view.toPlainText()
    assert w.thought_toggle.text().startswith("▾")
    w.thought_toggle.click()
    assert not w.thought_view.isVisible()
    assert w.body.toPlainText() == "Answer"  # Markdown rendered
    # while the model thinks, the thought is open and says so
    w.show_stream("", "Hmm", 0.8, [], thinking=True)
    assert w.thought_view.isVisible() and w.thought_toggle.text() == "▾ Thinking… 0.8 s"


def test_copy_buttons(qtbot) -> None:
    from flashdesk.app.chat.message_widget import MessageWidget

    w = MessageWidget(_message(content=MD))
    qtbot.addWidget(w)
    w.show()
    assert "Copy code" in w.body.toPlainText()
    w.body.anchorClicked.emit(QUrl("copy:0"))
    assert QGuiApplication.clipboard().text() == "print('hi')"
    w.body.anchorClicked.emit(QUrl("copy:2"))
    assert QGuiApplication.clipboard().text() == "unclosed();"
    w.copy_button.click()
    assert QGuiApplication.clipboard().text() == MD


def test_copy_code_links_work_from_the_keyboard(qtbot) -> None:
    from PySide6.QtTest import QTest

    from flashdesk.app.chat.message_widget import MessageWidget

    w = MessageWidget(_message(content=MD))
    qtbot.addWidget(w)
    w.show()
    QGuiApplication.clipboard().setText("")
    assert w.body.focusPolicy() == Qt.FocusPolicy.StrongFocus
    w.activateWindow()
    w.body.setFocus()
    for _ in range(100):  # polled: qtbot's waits can return early after an app event loop ran
        if w.body.hasFocus():
            break
        QTest.qWait(10)
    assert w.body.hasFocus()
    QTest.keyClick(w.body, Qt.Key.Key_Tab)  # to the first link
    QTest.keyClick(w.body, Qt.Key.Key_Return)
    assert QGuiApplication.clipboard().text() == "print('hi')"
    QTest.keyClick(w.body, Qt.Key.Key_Tab)
    QTest.keyClick(w.body, Qt.Key.Key_Return)
    assert QGuiApplication.clipboard().text() == "raw ``` inside"


def test_message_body_grows_with_its_text(qtbot) -> None:
    from flashdesk.app.chat.message_widget import MessageWidget

    w = MessageWidget(_message(content="short"))
    qtbot.addWidget(w)
    w.resize(500, 200)
    w.show()
    short = w.body.height()
    w.show_message(_message(content="\n\n".join(f"Paragraph {i} of a long reply." for i in range(30))))
    assert w.body.height() > 10 * short
    assert w.body.document().size().height() <= w.body.height()


def test_colour_by_origin(qtbot) -> None:
    from flashdesk.app.chat.message_widget import MessageWidget

    stats = {"tokens": 3, "origins": [[4, "t"], [6, "d"]]}
    w = MessageWidget(_message(content="The cat sat", stats=stats), colour_by_origin=False)
    qtbot.addWidget(w)
    w.show()
    assert "background-color" not in w.body.toHtml()
    w.set_colour_by_origin(True)
    assert w.body.toPlainText() == "The cat sat" and "background-color" in w.body.toHtml()


def test_interrupted_and_failed_states(qtbot) -> None:
    from flashdesk.app.chat.message_widget import MessageWidget
    from flashdesk.app.history.store import FAILED

    w = MessageWidget(_message(content="half", state=INTERRUPTED))
    qtbot.addWidget(w)
    w.show()
    assert "Interrupted" in w.status.text() and w.status.isVisible()
    w.show_message(_message(content="", state=FAILED, stats={"tokens": 0, "error": "CUDA out of memory"}))
    assert w.status.text() == "This reply failed: CUDA out of memory"


def test_composer_keys(qtbot) -> None:
    from flashdesk.app.chat.composer import Composer

    c = Composer()
    qtbot.addWidget(c)
    c.show()
    sent, stops = [], []
    c.send_requested.connect(sent.append)
    c.stop_requested.connect(lambda: stops.append(1))
    qtbot.keyClicks(c.edit, "line one")
    qtbot.keyClick(c.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(c.edit, "line two")
    assert c.edit.toPlainText() == "line one\nline two" and sent == []
    qtbot.keyClick(c.edit, Qt.Key.Key_Return)
    assert sent == ["line one\nline two"] and c.edit.toPlainText() == ""
    qtbot.keyClick(c.edit, Qt.Key.Key_Return)  # empty: nothing sent
    assert len(sent) == 1
    qtbot.keyClick(c.edit, Qt.Key.Key_Escape)
    assert stops == []  # nothing to stop
    c.set_busy(True)
    assert c.button.text() == "Stop (Esc)"
    qtbot.keyClick(c.edit, Qt.Key.Key_Escape)
    c.button.click()
    assert stops == [1, 1]
    c.set_busy(False)
    c.set_can_send(False, "Loading the model…")
    assert not c.button.isEnabled() and c.edit.placeholderText() == "Loading the model…"


def _step(index, emitted, draft, accepted, answer, elapsed, thought="", stats=None, seconds=0.01):
    step = p.Step(
        "r",
        index,
        emitted,
        draft,
        accepted,
        answer,
        thought,
        [[len(answer), p.TARGET]] if answer else [],
        seconds,
        0.0,
        seconds,
        elapsed,
        stats,
    )
    step.received = 100.0 + elapsed
    return step


def test_reply_statistics_and_energy() -> None:
    r = Reply("r", 7, sent_at=99.9, energy_start_mj=1_000_000)
    r.prompt_tokens = 50
    r.add_steps([_step(0, [5], [], 0, "", 0.1, thought="Hm", seconds=0.1)])
    r.add_steps(
        [
            _step(1, [6, 7, 8], [6, 7, 9], 2, "Hi there", 0.2, stats={"mean_acceptance_length": 3.0}),
            _step(
                2,
                [9],
                [1, 2, 3],
                0,
                "!",
                0.3,
                stats={"mean_acceptance_length": 2.0, "drafted": 6, "accepted": 2, "acceptance_rate": 1 / 3},
            ),
        ]
    )
    assert r.text == "Hi there!" and r.thought_text == "Hm" and r.tokens == 5
    assert r.live_tokens_per_second() == pytest.approx(4 / 0.2)
    r.finish(
        p.Finished(
            "r",
            "stop",
            "Hi there!",
            "Hm",
            [5, 6, 7, 8, 9],
            50,
            0.1,
            0.4,
            {"mean_acceptance_length": 2.0, "drafted": 6, "accepted": 2, "acceptance_rate": 1 / 3},
            2,
        ),
        energy_end_mj=1_025_000,
    )
    s = r.stats()
    assert s["ttft_seconds"] == pytest.approx(0.2)  # sent at 99.9, the first token arrived at 100.1
    assert s["decode_tokens_per_second"] == pytest.approx(4 / 0.2)
    assert s["prefill_tokens_per_second"] == pytest.approx(500)
    assert s["energy_joules"] == pytest.approx(25.0) and s["joules_per_token"] == pytest.approx(5.0)
    assert s["draft_lengths"] == [3] and s["finish_reason"] == "stop"
    text = footer_text(s)
    assert "5 tokens" in text and "20.0 tok/s" in text and "τ 2.00" in text and "5.00 J/token" in text


def test_spec_panel(qtbot) -> None:
    from flashdesk.app.panels.spec_panel import SpecPanel

    panel = SpecPanel()
    qtbot.addWidget(panel)
    panel.show()
    assert not panel.enabled.isEnabled()  # no drafter loaded
    changes = []
    panel.speculation_changed.connect(lambda on, n, method: changes.append((on, n)))
    panel.set_block_size(16, enabled=True, length=None)
    assert panel.length.maximum() == 15 and panel.length.value() == 15 and panel.enabled.isChecked()
    assert changes == []  # setting up the panel is not a user's change
    panel.length.setValue(4)
    panel.enabled.setChecked(False)
    assert changes == [(True, 4), (False, 4)]
    panel.length.setValue(0)  # below 1: the engine picks each step's length
    assert panel.length.text() == "auto" and changes[-1] == (False, "auto") and panel.values() == (False, "auto", None)
    panel.set_block_size(16, enabled=True, length="auto")
    assert panel.length.value() == 0 and panel.values() == (True, "auto", None)
    panel.show_stats(
        {
            "mean_acceptance_length": 2.5,
            "acceptance_rate": 0.375,
            "drafted": 8,
            "accepted": 3,
            "per_position_acceptance": [0.75, 0.5, 0.25, 0.0],
            "accepted_histogram": [1, 0, 1, 0, 0],
        },
        "This reply, live.",
    )
    assert panel.tau.text() == "τ = 2.50 tokens/step" and panel.rate.text() == "38%" and panel.counts.text() == "3 / 8"
    assert list(panel.positions.bars.opts["height"]) == [0.75, 0.5, 0.25, 0.0]
    assert list(panel.histogram.bars.opts["x"]) == [0, 1, 2, 3, 4]
    panel.show_stats(None, "No reply yet.")
    assert panel.tau.text() == "τ n/a" and panel.rate.text() == "n/a"


def test_spec_panel_offers_the_loaded_methods_and_shows_each_ones_figures(qtbot) -> None:
    from flashdesk.app.panels.spec_panel import SpecPanel

    panel = SpecPanel()
    qtbot.addWidget(panel)
    panel.set_methods(["mtp"])
    assert not panel.method.isEnabled() and panel.method.currentData() == "mtp"
    assert panel.enabled.text() == "Speculate with the Gemma 4 MTP assistant"
    panel.set_block_size(16, enabled=True, length=4)
    changes = []
    panel.speculation_changed.connect(lambda on, n, method: changes.append((on, n, method)))
    panel.set_methods(["dflash", "mtp"], "mtp")  # a new load: no change of the user's
    assert [panel.method.itemData(i) for i in range(panel.method.count())] == ["dflash", "mtp", "auto"]
    assert panel.method.isEnabled() and panel.values() == (True, 4, "mtp") and changes == []
    panel.method.setCurrentIndex(2)
    assert changes == [(True, 4, "auto")]
    panel.choose_method("dflash")  # the bench's "Use the best": quiet, the window sends the settings
    assert panel.values() == (True, 4, "dflash") and len(changes) == 1
    by_method = {
        "dflash": {"mean_acceptance_length": 3.1, "acceptance_rate": 0.72},
        "mtp": {"mean_acceptance_length": 1.8, "acceptance_rate": 0.61},
    }
    panel.show_stats({"mean_acceptance_length": 2.5, "by_method": by_method}, "This reply, live.")
    assert panel.by_method.text() == "DFlash τ 3.10, 72% · MTP τ 1.80, 61%" and not panel.by_method.isHidden()
    panel.show_stats(None, "No reply yet.")
    assert panel.by_method.isHidden()
    panel.set_methods([])
    assert panel.method.count() == 0 and panel.values()[2] is None


def test_the_footer_names_the_method_that_drafted() -> None:
    from flashdesk.app.chat.reply import footer_text

    one = {"tokens": 9, "mean_acceptance_length": 2.0, "methods": {"mtp": {"mean_acceptance_length": 2.0}}}
    assert "τ 2.00 (MTP)" in footer_text(one)
    both = {
        "tokens": 9,
        "mean_acceptance_length": 2.5,
        "methods": {"dflash": {"mean_acceptance_length": 3.1}, "mtp": {"mean_acceptance_length": 1.8}},
    }
    assert "τ 2.50 (DFlash 3.10, MTP 1.80)" in footer_text(both)
    assert "τ 2.00 ·" in footer_text({"tokens": 9, "mean_acceptance_length": 2.0})  # stored before methods


def test_markdown_export_closes_a_code_fence_a_cut_off_reply_left_open() -> None:
    from flashdesk.app.history.export import closed_fences, to_markdown

    cut = "Here:\n\n```python\ndef f():\n    return 1"
    assert closed_fences(cut) == cut + "\n```"
    assert closed_fences("~~~~\ncode\n```\nstill code") == "~~~~\ncode\n```\nstill code\n~~~~"
    done = "```\na\n```\ntext\n````js\nb\n`````\n"
    assert closed_fences(done) == done  # closed ones (a longer closing fence too) stay as they are
    inline = "```js``` is inline code.\nMore text"
    assert closed_fences(inline) == inline  # not a fence: nothing to close
    conv = Conversation(1, "Code", 0.0, 0.0, None, {})
    md = to_markdown(conv, [_message("assistant", cut, id=1), _message("user", "Thanks", id=2)])
    body = md.split("## Assistant", 1)[1]
    assert body.count("```") == 2 and body.index("```\n") < body.index("## You")


def test_export() -> None:
    from flashdesk.app.history.export import to_json, to_markdown

    conv = Conversation(1, "Sky", 0.0, 0.0, "Be brief.", {"temperature": 0.0})
    msgs = [
        _message("user", "Why is the sky blue?", id=1),
        _message(
            "assistant",
            "Rayleigh scattering.",
            id=2,
            thought="Physics.",
            thought_seconds=1.0,
            stats={"tokens": 3, "decode_tokens_per_second": 10.0, "joules_per_token": None},
        ),
    ]
    md = to_markdown(conv, msgs)
    assert md.startswith("# Sky\n") and "> Be brief." in md and "## You" in md and "## Assistant" in md
    assert "<details><summary>Thought (1.0 s)</summary>" in md and "10.0 tok/s" in md
    data = json.loads(to_json(conv, msgs))
    assert data["conversation"]["system_prompt"] == "Be brief."
    assert data["messages"][1]["thought"] == "Physics." and data["messages"][1]["stats"]["tokens"] == 3


@pytest.mark.parametrize(
    "message, title",
    [
        ("## **Fix** the `main()` _loop_", "Fix the main() loop"),
        ("```python\nprint('hi')\n```\nWhy?", "print('hi') Why?"),
        ("> quoted\n> text", "quoted text"),
        ("- one\n* two\n+ three\n1. four\n2) five\n- [x] done", "one two three four five done"),
        (
            "See [the docs](https://x.org/a_b) and ![a chart](c.png) or <https://y.org>",
            "See the docs and a chart or https://y.org",
        ),
        ("snake_case and 2 * 3 * 4 stay", "snake_case and 2 * 3 * 4 stay"),
        ("~~old~~ __new__ ***both***", "old new both"),
        ("  many\n\n spaces\tand\nlines  ", "many spaces and lines"),
        ("# Title #\n---\nbody", "Title body"),
        ("```\n```", ""),
    ],
)
def test_titles_are_plain_text(message: str, title: str) -> None:
    from flashdesk.app.history.titles import title_from

    assert title_from(message) == title


def test_long_titles_are_cut_at_a_word() -> None:
    from flashdesk.app.history.titles import TITLE_CHARS, title_from

    title = title_from("**Explain** how the borrow checker decides that a reference outlives its referent")
    assert title == "Explain how the borrow checker decides that a…" and len(title) <= TITLE_CHARS
    assert title_from("x" * 100) == "x" * (TITLE_CHARS - 1) + "…"  # one long word: cut inside it
    assert title_from("Short, then: " + "y" * 60, 20) == "Short, then…"


@pytest.mark.parametrize(
    "title, kind, name",
    [
        ("Sky", "md", "Sky.md"),
        ("Sky", "json", "Sky.json"),
        ('a/b\\c: "d" <e>|f?*', "md", "a b c d e f.md"),
        ("tab\tand\x00nul\x7f", "md", "tab and nul.md"),
        ("...hidden. ", "md", "hidden.md"),
        ("", "md", "conversation.md"),
        ("?/:", "json", "conversation.json"),
        ("con", "md", "con_.md"),
        ("Long title " * 10, "md", "Long title Long title Long title Long title Long title Long.md"),
        ("Why is the sky…", "md", "Why is the sky.md"),
    ],
)
def test_export_file_name(title: str, kind: str, name: str) -> None:
    from flashdesk.app.history.export import NAME_CHARS, file_name

    assert file_name(title, kind) == name and len(name) <= NAME_CHARS + len(".json")


def test_export_adds_the_extension_only_when_missing(tmp_path) -> None:
    from flashdesk.app.history.export import with_extension

    assert with_extension(tmp_path / "notes", "md") == tmp_path / "notes.md"
    assert with_extension(tmp_path / "notes.MD", "md") == tmp_path / "notes.MD"
    assert with_extension(tmp_path / "notes.markdown", "md") == tmp_path / "notes.markdown"
    assert with_extension(tmp_path / "notes.txt", "md") == tmp_path / "notes.txt.md"
    assert with_extension(tmp_path / "notes.md", "json") == tmp_path / "notes.md.json"
    assert with_extension(tmp_path / "v1.2 data.json", "json") == tmp_path / "v1.2 data.json"


def test_conversation_list_shows_snippets_and_says_when_nothing_matches(qtbot, tmp_path) -> None:
    from flashdesk.app.chat.conversation_list import ID_ROLE, SNIPPET_ROLE, ConversationList
    from flashdesk.app.history.store import Store

    store = Store(tmp_path / "f.db")
    pasta = store.create_conversation("Dinner <ideas>")
    store.add_message(pasta.id, "user", "How long do I boil pasta & rice?")
    store.create_conversation("Pasta shapes")
    w = ConversationList()
    qtbot.addWidget(w)
    w.resize(260, 400)
    w.show()

    def search(text: str) -> None:
        w.search.setText(text)
        w.fill(store.search(text), pasta.id)

    search("pasta")
    items = [w.list.item(i) for i in range(w.list.count())]
    assert [i.text() for i in items] == ["Pasta shapes", "Dinner <ideas>"]  # the titles, as they are
    assert items[0].data(SNIPPET_ROLE) is None  # the title matched: nothing to show under it
    assert items[1].data(SNIPPET_ROLE).endswith(" · How long do I boil <b>pasta</b> &amp; rice?")  # after when
    assert w.list.currentItem().data(ID_ROLE) == pasta.id
    rects = [w.list.visualItemRect(i) for i in items]
    assert rects[1].height() > rects[0].height()  # room for the snippet under the title
    assert not w.grab().isNull()  # the snippet paints
    assert w.list.isVisible() and not w.no_match.isVisible()

    search("xyz")
    assert w.list.count() == 0 and not w.list.isVisible()
    assert w.no_match.isVisible() and w.no_match.text() == "No conversation mentions “xyz”."
    search("")
    assert w.list.count() == 2 and w.list.isVisible() and not w.no_match.isVisible()
    assert all(w.list.item(i).data(SNIPPET_ROLE) is None for i in range(2))
    store.close()


def test_dark_theme_follows_the_override(qtbot, monkeypatch) -> None:
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QApplication

    from flashdesk.app import theme

    app = QApplication.instance()
    old = app.palette()
    try:
        monkeypatch.setenv("FLASHDESK_THEME", "dark")
        theme.apply(app)
        assert app.palette().color(QPalette.ColorRole.Window).lightness() < 80
        assert theme.colors()["plot_bg"] == "#1e1f22"
        monkeypatch.setenv("FLASHDESK_THEME", "light")
        theme.apply(app)
        assert app.palette().color(QPalette.ColorRole.Window).lightness() > 180
    finally:
        app.setPalette(old)


def test_app_modules_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, os; os.environ['QT_QPA_PLATFORM'] = 'offscreen';"
        "import flashdesk.app.main, flashdesk.app.main_window;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'triton')"
        " or m.startswith('flashdesk.engine'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_reply_footer_says_the_reuse_the_cap_and_what_was_left_out() -> None:
    from flashdesk.app.chat.reply import context_filled, context_note

    r = Reply("r", 7, sent_at=99.9, requested_max_tokens=2048)
    r.start(p.Started("r", 830, reused_tokens=800, dropped_messages=4, max_tokens=1200))
    assert (r.prompt_tokens, r.reused_tokens, r.prefill_tokens, r.dropped_messages, r.max_tokens) == (
        830,
        800,
        30,
        4,
        1200,
    )
    r.add_steps([_step(0, [5], [], 0, "Hi", 0.1, seconds=0.1)])
    r.finish(
        p.Finished("r", "context", "Hi", "", [5], 830, 0.1, 0.2, {"reused_tokens": 812, "prefill_tokens": 18}, 0), None
    )
    s = r.stats()
    assert (s["reused_tokens"], s["prefill_tokens"], s["dropped_messages"]) == (812, 18, 4)
    assert s["prefill_tokens_per_second"] == pytest.approx(180)  # the tokens prefilled, not the whole prompt
    text = footer_text(s)
    assert "reused 812 of 830 prompt tokens" in text and "limit 1200 tokens (capped by the context)" in text
    assert context_note(s).startswith("4 oldest messages were left out") and context_filled(s)
    assert context_note({"dropped_messages": 1}).startswith("The oldest message was left out")
    assert context_note({"tokens": 3}) == "" and not context_filled({"finish_reason": "length"})
    assert "reused" not in footer_text({"tokens": 3})  # older replies, stored before reuse was measured


def test_message_shows_the_context_note(qtbot) -> None:
    from flashdesk.app.chat.message_widget import CONTEXT_FULL_TEXT, MessageWidget

    w = MessageWidget(_message(content="cut", stats={"tokens": 5, "finish_reason": "context", "dropped_messages": 2}))
    qtbot.addWidget(w)
    w.show()
    assert w.note.isVisible() and "2 oldest messages" in w.note.text() and CONTEXT_FULL_TEXT in w.note.text()
    w.show_message(_message(content="fine", stats={"tokens": 5, "finish_reason": "stop"}))
    assert not w.note.isVisible()


def test_context_gauge_levels_and_words() -> None:
    from flashdesk.app.chat.context_gauge import NEAR, OK, OVER, Count, reply_room

    assert reply_room(4096, 2048) == 1024 and reply_room(4096, 100) == 100 and reply_room(2, 5) == 1
    count = lambda tokens: Count(tokens, 4096, 2048, (), False)  # noqa: E731 - usable: 3072
    assert [count(n).level for n in (100, 2700, 3072, 3073)] == [OK, NEAR, NEAR, OVER]
    assert count(3500).text() == "3,500 / 4,096 tokens" and count(3500).over
    assert "oldest turns will be left out" in count(3500).warning("drop_oldest")
    assert "refuse" in count(3500).warning("stop")
    assert "1,024 are kept for the reply" in count(10).tooltip("drop_oldest")


def test_composer_gauge(qtbot) -> None:
    from flashdesk.app.chat.composer import Composer

    c = Composer()
    qtbot.addWidget(c)
    c.show()
    assert not c.gauge.isVisible()
    c.set_gauge("10 / 4,096 tokens", "ok", "tip")
    assert c.gauge.isVisible() and c.gauge.text() == "10 / 4,096 tokens" and c.gauge.toolTip() == "tip"
    c.set_gauge("4,000 / 4,096 tokens", "over")
    assert "bold" in c.gauge.styleSheet() and c.gauge_level == "over"
    c.set_gauge(None)
    assert not c.gauge.isVisible()


def test_settings_dialog_context_policy_and_the_max_tokens_note(qtbot) -> None:
    from flashdesk.app.chat.settings_dialog import DEFAULT_SAMPLING, ConversationSettings, sampling_with_defaults

    assert DEFAULT_SAMPLING["context_policy"] == "drop_oldest"
    d = ConversationSettings("Chat", "", {"max_tokens": 300}, context_limit=4096)
    qtbot.addWidget(d)
    assert d.context_policy.currentData() == "drop_oldest"
    assert "Capped to what the context leaves" in d.max_tokens_note.text() and "4096 tokens" in d.max_tokens_note.text()
    assert "Capped" in d.max_tokens.toolTip()
    d.context_policy.setCurrentIndex(d.context_policy.findData("stop"))
    _system, values = d.result_values()
    assert values["context_policy"] == "stop" and values["max_tokens"] == 300
    again = ConversationSettings("Chat", "", sampling_with_defaults(values))
    qtbot.addWidget(again)
    assert again.context_policy.currentData() == "stop"


def test_typing_auto_in_the_draft_length_picks_it(qtbot) -> None:
    from PySide6.QtCore import Qt

    from flashdesk.app.panels.spec_panel import SpecPanel

    panel = SpecPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.set_block_size(16, enabled=True, length=6)
    changes = []
    panel.speculation_changed.connect(lambda on, n, method: changes.append(n))
    panel.length.lineEdit().selectAll()
    qtbot.keyClicks(panel.length, "auto")
    qtbot.keyClick(panel.length, Qt.Key.Key_Return)
    assert panel.length.value() == 0 and panel.values()[1] == "auto" and changes[-1] == "auto"
    panel.length.lineEdit().selectAll()
    qtbot.keyClicks(panel.length, "9")
    qtbot.keyClick(panel.length, Qt.Key.Key_Return)
    assert panel.values()[1] == 9


def test_a_passing_mouse_wheel_scrolls_the_page_and_leaves_the_fields_alone(qtbot) -> None:
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication, QScrollArea, QSpinBox, QVBoxLayout, QWidget

    from flashdesk.app.wheel_guard import wheel_only_when_focused

    page = QWidget()
    layout = QVBoxLayout(page)
    box = QSpinBox()
    box.setRange(0, 100)
    box.setValue(50)
    layout.addWidget(box)
    layout.addSpacing(2000)
    area = QScrollArea()
    area.setWidget(page)
    area.resize(300, 200)
    qtbot.addWidget(area)
    area.show()
    wheel_only_when_focused(box)

    def roll() -> None:
        centre = QPointF(box.rect().center())
        event = QWheelEvent(
            centre, QPointF(box.mapToGlobal(box.rect().center())), QPoint(0, 0), QPoint(0, -120),
            Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False,
        )  # fmt: skip
        QApplication.sendEvent(box, event)

    roll()
    assert box.value() == 50 and area.verticalScrollBar().value() > 0  # the page scrolled instead
    box.setFocus()
    qtbot.waitUntil(box.hasFocus)
    roll()
    assert box.value() == 49  # once focused, the wheel is the field's


def test_no_field_of_the_window_changes_under_a_passing_wheel(qtbot) -> None:
    """Every spin box and combo box on the setup page, the side panel and the Benchmark page is
    guarded: an unfocused field keeps its value when the wheel passes over it."""
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QComboBox

    from flashdesk.app.history.store import Store
    from flashdesk.app.main_window import MainWindow

    w = MainWindow(Store(":memory:"))
    qtbot.addWidget(w)
    fields = [f for f in w.findChildren(QAbstractSpinBox) + w.findChildren(QComboBox) if f.isEnabled()]
    assert len(fields) >= 8
    for field in fields:
        if isinstance(field, QComboBox) and field.count() < 2:
            field.addItems(["one", "two", "three"])
        before = field.currentIndex() if isinstance(field, QComboBox) else field.text()
        field.clearFocus()
        for delta in (-120, 120):
            event = QWheelEvent(
                QPointF(2, 2), QPointF(field.mapToGlobal(QPoint(2, 2))), QPoint(0, 0), QPoint(0, delta),
                Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False,
            )  # fmt: skip
            QApplication.sendEvent(field, event)
            after = field.currentIndex() if isinstance(field, QComboBox) else field.text()
            assert after == before, field.objectName() or type(field).__name__


def test_an_engine_message_that_names_a_command_says_what_to_press_instead() -> None:
    from flashdesk.app.main_window import for_the_window

    engine = "org/model is not on this computer: run `flashdesk models pull org/model` to download it"
    assert for_the_window(engine) == (
        "org/model is not on this computer: press Download on the setup page (it fetches org/model) to download it"
    )
    assert for_the_window("no such folder") == "no such folder"


def test_search_hits_say_when_and_the_conversation_writing_a_reply_is_marked(qtbot) -> None:
    import time

    from flashdesk.app.chat.conversation_list import SNIPPET_ROLE, ConversationList, short_date
    from flashdesk.app.history.store import SearchHit

    now = time.mktime((2026, 12, 4, 15, 30, 0, 0, 0, -1))
    assert short_date(now - 3600, now) == "14:30"
    assert short_date(time.mktime((2026, 3, 9, 10, 0, 0, 0, 0, -1)), now) == "Mar 9"
    assert short_date(time.mktime((2025, 3, 9, 10, 0, 0, 0, 0, -1)), now) == "2025-03-09"
    view = ConversationList()
    qtbot.addWidget(view)
    a, b = Conversation(1, "Sky", 0.0, now, "", {}), Conversation(2, "Sea", 0.0, now, "", {})
    view.fill([SearchHit(a, "why is the \x02sky\x03 blue", 7), SearchHit(b)], 1, writing=2)
    first, second = view.list.item(0), view.list.item(1)
    assert first.text() == "Sky" and first.data(SNIPPET_ROLE).startswith(short_date(now) + " · ")
    assert second.text() == "Sea" and second.font().italic() and "writing a reply now" in second.toolTip()
    assert not first.font().italic()  # the title stays the title (F2 edits it): the mark is apart


def test_a_reply_before_its_first_token_says_it_waits(qtbot) -> None:
    from flashdesk.app.chat.message_widget import WAITING_TEXT, MessageWidget

    w = MessageWidget(_message(content="", state="streaming"))
    qtbot.addWidget(w)
    assert w.status.text() == WAITING_TEXT
    w.show_stream("Hel", "", None, [], False)
    assert w.status.isHidden() and not w.status.text()


def test_copy_says_it_copied(qtbot) -> None:
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QToolTip

    from flashdesk.app.chat.message_widget import MessageWidget

    w = MessageWidget(_message(content="**Answer**"))
    qtbot.addWidget(w)
    w.show()
    w.copy()
    assert QGuiApplication.clipboard().text() == "**Answer**" and QToolTip.text() == "Copied the message"


def test_a_banners_buttons_sit_under_its_text(qtbot) -> None:
    from flashdesk.app.chat.banner import Banner

    banner = Banner("testBanner")
    qtbot.addWidget(banner)
    banner.resize(600, 200)
    banner.show_text("The context filled up: " + "a long explanation " * 10, "Drop oldest", "info", "New conversation")
    qtbot.waitUntil(lambda: banner.label.width() > 0)
    assert banner.label.width() > 450  # the whole strip, not a column beside the buttons
    assert banner.button.mapTo(banner, banner.button.rect().topLeft()).y() > banner.label.geometry().bottom() - 1
    banner.show_text("Just a note.")
    assert banner.buttons.isHidden()


def test_a_setup_error_shows_in_the_box_that_said_the_check_would_appear_there(qtbot) -> None:
    from flashdesk.app.pages.setup_page import SetupPage

    page = SetupPage()
    qtbot.addWidget(page)
    page.show_error("Out of memory: not enough GPU memory: 25.1 GiB needed at 262144 tokens, 23.5 GiB free.")
    assert "25.1 GiB needed" in page.plan.toPlainText()
    page.show_plan(["model: ok"], [])
    page.show_error("Download failed: no connection")
    assert page.plan.toPlainText() == "model: ok"  # a check shown stays; the error is above it


def test_the_full_context_banner_says_how_continue_goes_on_for_the_engine_and_for_a_server() -> None:
    from flashdesk.app.chat.context_gauge import context_full_text

    local, remote = context_full_text(4096), context_full_text(4096, remote=True)
    assert "4,096 tokens" in local and "writes on in the same reply" in local and "Continue." not in local
    assert "“Continue.” message" in remote and "vLLM" in remote
