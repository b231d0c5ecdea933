"""The look (issue 11, polish): icon actions, comfortable reply text, settings under headings,
colour by origin over the rendered Markdown, gaps in the telemetry plots while the engine was down,
and a one-line no-GPU note. Widgets are built directly, offscreen; no engine process."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest
from PySide6.QtGui import QColor, QFontDatabase, QPainterPath, QTextBlockFormat, QTextFormat
from PySide6.QtWidgets import QScrollArea

from flashdesk.app.history.store import COMPLETE, Message

REPLY = "# Plan\n\nSome **bold** words.\n\n- first item\n- second item\n\n```python\nprint('hi')\n```\n\nDone."


def _message(role: str = "assistant", content: str = "", **kw) -> Message:
    return Message(kw.pop("id", 1), 1, role, content, COMPLETE, time.time(), time.time(), **kw)


def _blocks(doc) -> list:
    blocks, block = [], doc.begin()
    while block.isValid():
        blocks.append(block)
        block = block.next()
    return blocks


def _fragments(block) -> list:
    out, it = [], block.begin()
    while not it.atEnd():
        out.append(it.fragment())
        it += 1
    return out


def _drafted(block) -> list[str]:
    """The texts of a block shown with the draft background."""
    from flashdesk.app import theme

    draft = QColor(theme.colors()["draft_bg"])
    return [
        f.text()
        for f in _fragments(block)
        if f.charFormat().background().color() == draft
        and f.charFormat().hasProperty(QTextFormat.Property.BackgroundBrush)
    ]


# -- 1. message actions are icons with tooltips ------------------------------------------------------


@pytest.mark.parametrize(
    "role, names", [("assistant", ("copy_button", "regen_button")), ("user", ("copy_button", "edit_button"))]
)
def test_message_actions_are_flat_icon_buttons(qtbot, role, names) -> None:
    from PySide6.QtCore import Qt

    from flashdesk.app.chat.message_widget import MessageWidget

    w = MessageWidget(_message(role, "Hi"))
    qtbot.addWidget(w)
    w.show()
    words = {"copy_button": "Copy", "edit_button": "Edit", "regen_button": "Regenerate"}
    for name in names:
        button = getattr(w, name)
        assert button.isVisible() and button.autoRaise() and not button.icon().isNull()
        assert button.toolButtonStyle() == Qt.ToolButtonStyle.ToolButtonIconOnly
        assert button.text() == words[name] and button.toolTip().startswith(words[name])


def test_icons_take_the_theme_colour(qtbot, monkeypatch) -> None:
    from flashdesk.app import theme
    from flashdesk.paths import assets_dir

    for name in ("copy", "edit", "regenerate"):
        assert "currentColor" in (assets_dir() / "icons" / f"{name}.svg").read_text()
    seen = {}
    for scheme in ("light", "dark"):
        monkeypatch.setenv("FLASHDESK_THEME", scheme)
        image = theme.icon("copy").pixmap(48, 48).toImage()
        opaque = [image.pixelColor(x, y) for x in range(48) for y in range(48) if image.pixelColor(x, y).alpha() == 255]
        assert opaque and all(c.rgb() == QColor(theme.colors()["muted"]).rgb() for c in opaque)
        seen[scheme] = opaque[0].rgb()
    assert seen["light"] != seen["dark"]


# -- 2. reply text at a comfortable size and line length ----------------------------------------------


def test_message_text_is_larger_with_airy_lines(qtbot) -> None:
    from flashdesk.app.chat.message_widget import BODY_SCALE, LINE_HEIGHT_PERCENT, MessageWidget

    w = MessageWidget(_message(content=REPLY))
    qtbot.addWidget(w)
    w.show()
    assert w.body.font().pointSizeF() == pytest.approx(w.font().pointSizeF() * BODY_SCALE)
    prose = [b for b in _blocks(w.body.document()) if b.text() == "Some bold words."][0]
    fmt = prose.blockFormat()
    assert fmt.lineHeight() == LINE_HEIGHT_PERCENT
    assert fmt.lineHeightType() == QTextBlockFormat.LineHeightTypes.ProportionalHeight.value
    user = MessageWidget(_message("user", "Hello"))
    qtbot.addWidget(user)
    assert user.objectName() == "userMessage" and "userMessage" in user.styleSheet()  # the bubble
    assert user.body.font().pointSizeF() == pytest.approx(w.body.font().pointSizeF())


def test_messages_keep_to_a_centred_column(qtbot) -> None:
    from flashdesk.app.chat.chat_view import SIDE_MARGIN, ChatView
    from flashdesk.app.chat.message_widget import LINE_CHARS, column_width

    view = ChatView()
    qtbot.addWidget(view)
    view.set_messages([_message("user", "Hi", id=1), _message(content="A reply. " * 80, id=2)])
    view.resize(1800, 700)
    view.show()
    limit = column_width(view.font())
    assert limit > LINE_CHARS * 5
    inner = QScrollArea.widget(view)  # ChatView.widget() looks up a message
    for widget in view.widgets.values():
        qtbot.waitUntil(lambda w=widget: w.width() <= limit)
        left, right = widget.x(), inner.width() - widget.x() - widget.width()
        assert abs(left - right) <= 2 and widget.width() >= limit - 2
    view.resize(500, 700)
    reply = view.widgets[2]
    qtbot.waitUntil(lambda: reply.width() == inner.width() - 2 * SIDE_MARGIN)


# -- 3. settings under headings ---------------------------------------------------------------------


def test_settings_are_grouped_under_headings(qtbot) -> None:
    from flashdesk.app.chat.settings_dialog import ConversationSettings

    d = ConversationSettings("Chat", "Be brief.", {"temperature": 0.5, "top_k": 20})
    qtbot.addWidget(d)
    d.show()
    assert [h.text() for h in d.headings] == ["Conversation", "Sampling", "Reply", "Context"]
    assert all(h.font().bold() for h in d.headings)
    tops = [h.mapTo(d, h.rect().topLeft()).y() for h in d.headings] + [d.height()]
    sections = {
        "systemPrompt": 0,
        "temperature": 1,
        "topP": 1,
        "topK": 1,
        "maxTokens": 2,
        "thinking": 2,
        "contextPolicy": 3,
    }
    for name, section in sections.items():
        field = d.findChild(object, name)
        y = field.mapTo(d, field.rect().topLeft()).y()
        assert tops[section] < y < tops[section + 1], name
    system, values = d.result_values()
    assert system == "Be brief." and values["temperature"] == 0.5 and values["top_k"] == 20
    assert set(values) == {"temperature", "top_p", "top_k", "max_tokens", "thinking", "context_policy"}


# -- 4. colour by origin keeps the Markdown --------------------------------------------------------


def test_colour_by_origin_keeps_the_markdown(qtbot) -> None:
    from flashdesk.app.chat.message_widget import MessageWidget

    bold, code = REPLY.index("bold"), REPLY.index("print")
    origins = [[bold, "t"], [4, "d"], [code - bold - 4, "t"], [5, "d"], [len(REPLY) - code - 5, "t"]]
    w = MessageWidget(_message(content=REPLY, stats={"origins": origins}), colour_by_origin=True)
    qtbot.addWidget(w)
    w.show()
    blocks = {b.text(): b for b in _blocks(w.body.document())}
    assert blocks["Plan"].blockFormat().headingLevel() == 1
    assert blocks["first item"].textList() is not None and blocks["second item"].textList() is not None
    code_block = blocks["print('hi')"]
    assert code_block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)
    fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
    assert all(f.charFormat().font().family() == fixed for f in _fragments(code_block))
    assert _drafted(blocks["Some bold words."]) == ["bold"]
    assert _drafted(code_block) == ["print"]
    assert not _drafted(blocks["Plan"]) and not _drafted(blocks["Copy code"])
    w.set_colour_by_origin(False)
    assert not any(_drafted(b) for b in _blocks(w.body.document()))
    assert w.body.document().begin().blockFormat().headingLevel() == 1


def test_draft_ranges_skip_markdown_syntax() -> None:
    from flashdesk.app.chat.markdown import draft_ranges, masked_source

    text = "- [a link](https://example.org)here\n\n```python\npass\n```"
    assert masked_source(text).count("\0") == len("-") + len("(https://example.org)") + len("```python") + 3
    # rendered: "a link" at 0, "here" at 6, "pass" at 11; everything drafted but the URL
    start = text.index("here")
    ranges = draft_ranges(text, [[start, "d"], [len(text) - start, "t"]], [(0, "a link"), (6, "here"), (11, "pass")])
    assert ranges == [(0, 6)]  # the link text; "here" is not matched to the URL's letters
    code = text.index("pass")
    ranges = draft_ranges(text, [[code, "t"], [4, "d"]], [(0, "a link"), (6, "here"), (11, "pass")])
    assert ranges == [(11, 15)]  # "pass", not "p" of the fence's "python"


# -- 5. plots leave a gap while the engine was down -----------------------------------------------


def test_plots_break_while_the_engine_was_down(qtbot) -> None:
    from flashdesk.app.panels.telemetry import GpuReading, Sample
    from flashdesk.app.panels.telemetry_panel import TelemetryPanel

    panel = TelemetryPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.set_gpu_available(True, None)
    panel.set_live(30.0)
    running = [True, True, False, False, True, True]
    for i, up in enumerate(running):
        panel.on_sample(Sample(100.0 + i, GpuReading(power_w=200.0), 3 << 30, 1 << 30, 1 << 34, worker_running=up))
    for plot in (panel.tps_plot, panel.second_plot):
        ys = plot.curve.getData()[1]
        assert [math.isnan(y) for y in ys] == [not up for up in running]
        path = plot.curve.curve.getPath()
        points = [path.elementAt(i) for i in range(path.elementCount())]
        spans = [b.x - a.x for a, b in zip(points, points[1:]) if b.type == QPainterPath.ElementType.LineToElement]
        assert spans and max(spans) <= 1.01  # a line between neighbouring samples only, none across the gap
        assert {
            round(a.x)
            for a, b in zip(points, points[1:])
            if b.x - a.x > 0.5 and b.type == QPainterPath.ElementType.LineToElement
        } == {-5, -1}  # one each side of the gap
    assert panel.tps_plot.getPlotItem().viewRange()[1][1] > 30  # the axis follows the finite values


def test_worker_alive() -> None:
    import os

    from flashdesk.app.panels.telemetry import worker_alive

    assert worker_alive(os.getpid()) and not worker_alive(None)
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert not worker_alive(done.pid)


# -- 6. the no-GPU note: one friendly line, the driver's words on hover -------------------------------


def test_no_gpu_note_is_one_line_with_the_detail_on_hover(qtbot) -> None:
    from flashdesk.app.panels.telemetry_panel import NO_GPU_TEXT, TelemetryPanel

    panel = TelemetryPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.set_gpu_available(False, "NVML is not available (NVMLError: Driver Not Loaded)")
    assert panel.notice.isVisible() and panel.notice.text() == NO_GPU_TEXT
    assert "Driver Not Loaded" in panel.notice.toolTip() and "NVML" not in panel.notice.text()
    panel.set_gpu_available(True, None)
    assert not panel.notice.isVisible()


def test_an_unchecked_box_shows_on_a_dark_window(qtbot) -> None:
    """Fusion frames a check box in the window's colour darkened: on the dark palette an unchecked
    box was a few shades from the window. Its frame now stands out as far as the muted text."""
    from PySide6.QtWidgets import QApplication, QCheckBox, QRadioButton, QStyle

    from flashdesk.app import theme

    app = QApplication.instance()
    style, palette = app.style().name(), app.palette()
    try:
        theme.set_choice("dark")
        window = app.palette().window().color()
        for box in (QCheckBox("unchecked"), QRadioButton("unchecked")):
            qtbot.addWidget(box)
            box.show()
            image = box.grab().toImage()
            indicator = box.style().pixelMetric(QStyle.PixelMetric.PM_IndicatorWidth)  # the box, not its text
            spread = max(
                abs(QColor(image.pixel(x, y)).lightness() - window.lightness())
                for x in range(indicator)
                for y in range(image.height())
            )
            assert spread >= 80, (type(box).__name__, spread)
    finally:
        theme.set_choice("system")
        if style:
            app.setStyle(style)
        app.setPalette(palette)
