"""One message in the chat: who, the thought (collapsible, with its duration), the body, a note on
the context (older messages left out to fit it, or the reply stopped because it was full), the footer.

The body is a QTextBrowser that grows to its text (the chat view scrolls, not each message), shows
Markdown with a copy link above each code block and, with "colour by origin" on, the characters of
accepted draft tokens highlighted in it. Its text is a little larger than the UI's, with airy lines,
and the chat view keeps it to about LINE_CHARS characters a line: easier to read, as in chat apps.
"""

from __future__ import annotations

import math
import time

from PySide6.QtCore import QRect, QSize, Qt, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QCursor,
    QDesktopServices,
    QFont,
    QFontMetrics,
    QGuiApplication,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QTextBrowser,
    QTextEdit,
    QToolButton,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from flashdesk.app import theme
from flashdesk.app.chat.markdown import COPY_SCHEME, draft_ranges, with_copy_links
from flashdesk.app.chat.reply import context_filled, context_note, footer_text
from flashdesk.app.history.store import CANCELLED, FAILED, INTERRUPTED, STREAMING, Message

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
STATE_TEXT = {
    CANCELLED: "Stopped.",
    INTERRUPTED: "Interrupted: the engine stopped before this reply was finished. What arrived is kept.",
    FAILED: "This reply failed.",
}
WAITING_TEXT = "Waiting for the model: the prompt is read first (or a request to the API server runs)."
COPIED_MS = 1500  # how long "Copied" shows
CONTEXT_FULL_TEXT = "The context filled up: this reply stopped at the end of the context."
BODY_SCALE = 1.1  # message text against the UI's font
LINE_HEIGHT_PERCENT = 140
LINE_CHARS = 80  # the longest line of message text, in average characters
MARGIN = 12  # a message's left and right padding
ICON_SIZE = QSize(16, 16)


def body_font(base: QFont) -> QFont:
    font = QFont(base)
    font.setPointSizeF(base.pointSizeF() * BODY_SCALE)
    return font


def column_width(base: QFont) -> int:
    """The widest a message gets: LINE_CHARS characters of its text and its padding."""
    return QFontMetrics(body_font(base)).averageCharWidth() * LINE_CHARS + 2 * MARGIN


def copied(widget: QWidget, text: str) -> None:
    """Say, for a moment beside `widget`, that the clipboard now holds what was asked for."""
    QToolTip.showText(QCursor.pos(), text, widget, QRect(), COPIED_MS)  # where the click was


class TextBlock(QTextBrowser):
    """A read-only text as tall as its content, with `copy:N` links that copy code block N."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.code: list[str] = []
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.setStyleSheet("QTextBrowser { background: transparent; }")
        self.document().setDocumentMargin(2)
        self.document().setUndoRedoEnabled(False)  # read-only: restyling after each render keeps no history
        self.document().documentLayout().documentSizeChanged.connect(lambda _size: self._fit())
        self.anchorClicked.connect(self._anchor)

    def set_markdown(self, text: str, origins: list[list] | None = None) -> None:
        """Show `text` as Markdown; with `origins`, its accepted draft characters highlighted."""
        markdown, self.code = with_copy_links(text)
        self.document().setMarkdown(markdown, QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
        # with code blocks the body is a Tab stop: Tab walks its Copy code links, Enter copies
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus if self.code else Qt.FocusPolicy.ClickFocus)
        self._style_blocks()
        if origins:
            self._highlight(text, origins)
        self._fit()

    def find_words(self, words: list[str]) -> int:
        """Highlight every place these words (a search's) occur, case aside; how many there are.
        [] clears the highlight."""
        marks = []
        color = QColor(theme.colors()["warn_bg"])
        for word in words:
            cursor = QTextCursor(self.document())
            while True:
                cursor = self.document().find(word, cursor)
                if cursor.isNull():
                    break
                mark = QTextEdit.ExtraSelection()
                mark.cursor = cursor
                mark.format.setBackground(color)
                marks.append(mark)
        self.setExtraSelections(marks)
        return len(marks)

    def set_plain(self, text: str) -> None:
        self.code = []
        self.setPlainText(text)
        self._style_blocks()
        self._fit()

    def _style_blocks(self) -> None:
        """Prose gets airy lines; code blocks a tinted background, and their long lines wrap instead
        of running off the edge. One edit block: the document is laid out once, not per block."""
        block = self.document().begin()
        background = QColor(theme.colors()["code_bg"])
        cursor = QTextCursor(self.document())
        cursor.beginEditBlock()
        while block.isValid():
            fmt = block.blockFormat()
            if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
                fmt.setBackground(background)
                fmt.setNonBreakableLines(False)
            else:
                fmt.setLineHeight(LINE_HEIGHT_PERCENT, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value)
            cursor.setPosition(block.position())
            cursor.setBlockFormat(fmt)
            block = block.next()
        cursor.endEditBlock()

    def _highlight(self, text: str, origins: list[list]) -> None:
        """Give the rendered characters of accepted draft tokens the draft colours."""
        c = theme.colors()
        fmt = QTextCharFormat()
        fmt.setBackground(QColor(c["draft_bg"]))
        fmt.setForeground(QColor(c["draft_fg"]))
        cursor = QTextCursor(self.document())
        cursor.beginEditBlock()
        for start, end in draft_ranges(text, origins, self._source_fragments()):
            cursor.setPosition(start)
            cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(fmt)
        cursor.endEditBlock()

    def _source_fragments(self) -> list[tuple[int, str]]:
        """The rendered text as (position, text), less the copy links (they are not in the reply)."""
        fragments = []
        block = self.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                if not fragment.charFormat().anchorHref().startswith(f"{COPY_SCHEME}:"):
                    fragments.append((fragment.position(), fragment.text()))
                it += 1
            block = block.next()
        return fragments

    def _anchor(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:
            try:
                QGuiApplication.clipboard().setText(self.code[int(url.path())])
                copied(self, "Copied the code")
            except (ValueError, IndexError):
                pass
        elif url.scheme() in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)

    def _fit(self) -> None:
        self.document().setTextWidth(self.viewport().width())
        height = math.ceil(self.document().size().height()) + 2 * self.frameWidth()
        if self.height() != height:
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()

    def sizeHint(self) -> QSize:
        return QSize(400, self.height())


class MessageWidget(QFrame):
    edit_submitted = Signal(int, str)  # message id, new text
    edit_started = Signal(int)  # message id: the editor opened (the view says what follows and scrolls to it)
    regenerate_requested = Signal(int)  # message id
    version_requested = Signal(int, int)  # message id, -1 (the version before) or +1 (the one after)

    def __init__(self, message: Message, colour_by_origin: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.message = message
        self.colour_by_origin = colour_by_origin
        self.thought_open = False
        self.streaming = False
        self._origins: list[list] = []
        self.setObjectName("userMessage" if message.role == "user" else "assistantMessage")
        self.setFrameShape(QFrame.Shape.NoFrame)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(MARGIN, 8, MARGIN, 8)
        layout.setSpacing(4)

        header = QHBoxLayout()
        self.role = QLabel(f"<b>{ROLE_NAMES.get(message.role, message.role)}</b>")
        self.when = QLabel(time.strftime("%H:%M", time.localtime(message.created)))
        self.when.setObjectName("muted")
        header.addWidget(self.role)
        header.addWidget(self.when)
        header.addStretch(1)
        self.copy_button = self._tool("Copy", "copy", "Copy the message as Markdown")
        self.copy_button.clicked.connect(self.copy)
        header.addWidget(self.copy_button)
        self.edit_button = self._tool("Edit", "edit", "Edit the message and send it again")
        self.edit_button.clicked.connect(self.start_edit)
        self.edit_button.setVisible(message.role == "user")
        header.addWidget(self.edit_button)
        self.regen_button = self._tool("Regenerate", "regenerate", "Regenerate: write this reply again")
        self.regen_button.clicked.connect(lambda: self.regenerate_requested.emit(self.message.id))
        self.regen_button.setVisible(message.role == "assistant")
        header.addWidget(self.regen_button)
        layout.addLayout(header)
        # the versions of a regenerated reply or an edited message: ‹ 2/3 ›
        self.older = self._arrow("‹", "The version before", -1)
        self.version_label = QLabel()
        self.version_label.setObjectName("versionLabel")
        self.newer = self._arrow("›", "The version after", +1)
        self.versions_row = QWidget()
        versions = QHBoxLayout(self.versions_row)
        versions.setContentsMargins(0, 0, 0, 0)
        versions.setSpacing(2)
        for w in (self.older, self.version_label, self.newer):
            versions.addWidget(w)
        versions.addStretch(1)

        self.thought_toggle = QToolButton()
        self.thought_toggle.setObjectName("thoughtToggle")
        self.thought_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.thought_toggle.setAutoRaise(True)
        self.thought_toggle.clicked.connect(self.toggle_thought)
        self.thought_view = TextBlock()
        self.thought_view.setObjectName("thought")
        layout.addWidget(self.thought_toggle)
        layout.addWidget(self.thought_view)

        self.body = TextBlock()
        self.body.setObjectName("body")
        self.body.setFont(body_font(self.font()))
        layout.addWidget(self.body)

        self.editor = QPlainTextEdit()
        self.editor.setObjectName("editor")
        self.editor.setMinimumHeight(80)
        self.edit_send = QPushButton("Save and send")
        self.edit_send.clicked.connect(self._submit_edit)
        self.edit_cancel = QPushButton("Cancel")
        self.edit_cancel.clicked.connect(self.cancel_edit)
        self.edit_row = QWidget()
        self.edit_note = QLabel()  # what becomes of what follows, set by the view that knows it
        self.edit_note.setObjectName("editNote")
        self.edit_note.setWordWrap(True)
        row = QHBoxLayout(self.edit_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.edit_note, 1)
        row.addWidget(self.edit_cancel)
        row.addWidget(self.edit_send)
        layout.addWidget(self.editor)
        layout.addWidget(self.edit_row)
        self.editor.hide()
        self.edit_row.hide()

        self.note = QLabel()
        self.note.setObjectName("contextNote")
        self.note.setWordWrap(True)
        self.note.hide()
        layout.addWidget(self.note)
        self.status = QLabel()
        self.status.setObjectName("status")
        self.status.setWordWrap(True)
        self.footer = QLabel()
        self.footer.setObjectName("footer")
        self.footer.setWordWrap(True)
        self.footer.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.status)
        layout.addWidget(self.footer)
        layout.addWidget(self.versions_row)
        self.apply_style()
        self.show_message(message)

    def _tool(self, text: str, icon: str, tip: str) -> QToolButton:
        """A flat icon button; its text stays its name for screen readers (and tests)."""
        button = QToolButton(self)  # a parent now: shown parentless it would flash up as a window
        button.setText(text)
        button.setAccessibleName(text)
        button.setProperty("iconName", icon)
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        button.setIconSize(ICON_SIZE)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        return button

    def _arrow(self, text: str, tip: str, step: int) -> QToolButton:
        button = QToolButton(self)
        button.setText(text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.clicked.connect(lambda: self.version_requested.emit(self.message.id, step))
        return button

    def _show_versions(self, message: Message) -> None:
        """‹ n/N › under a reply that was regenerated or a message that was edited (hidden while a
        reply streams): each version keeps the messages that followed it."""
        many = message.versions > 1 and not self.streaming
        self.versions_row.setVisible(many)
        if many:
            self.version_label.setText(f"{message.version}/{message.versions}")
            what = "reply" if message.role == "assistant" else "message"
            self.version_label.setToolTip(
                f"Version {message.version} of {message.versions} of this {what}, each with the messages "
                "that followed it: the one shown is what the next turn sees"
            )
            self.older.setEnabled(message.version > 1)
            self.newer.setEnabled(message.version < message.versions)

    def apply_style(self) -> None:
        c = theme.colors()
        for button in (self.copy_button, self.edit_button, self.regen_button):
            button.setIcon(theme.icon(button.property("iconName")))
        self.setStyleSheet(
            f"QFrame#userMessage {{ background: {c['user_bg']}; border-radius: 10px; }}"
            f'QFrame[marked="true"] {{ border: 2px solid {c["accent"]}; border-radius: 10px; }}'
            f"QLabel#muted, QLabel#footer {{ color: {c['muted']}; }}"
            f"QLabel#contextNote {{ color: {c['warn']}; font-style: italic; }}"
            f"QLabel#status {{ color: {c['error']}; }}"
            f"QTextBrowser#thought {{ color: {c['muted']}; border: none; border-left: 3px solid {c['muted']}; "
            "padding-left: 8px; background: transparent; }"
            f"QToolButton#thoughtToggle {{ color: {c['muted']}; }}"
        )

    def set_marked(self, on: bool, words: list[str] | None = None) -> None:
        """Outline the message (a search hit just opened), its search words highlighted, or stop."""
        self.body.find_words((words or []) if on else [])
        self.setProperty("marked", on)
        self.style().unpolish(self)
        self.style().polish(self)

    # -- content ------------------------------------------------------------------------------------

    def show_message(self, message: Message) -> None:
        """Show a stored message (complete, stopped, interrupted or failed)."""
        self.message = message
        self.streaming = message.state == STREAMING
        self._origins = (message.stats or {}).get("origins") or []
        self._set_thought(message.thought, message.thought_seconds, thinking=False)
        self._set_body(message.content)
        waiting = message.state == STREAMING and not (message.content or message.thought)
        self._set_state(message.state, (message.stats or {}).get("error"), waiting)
        self.footer.setText(footer_text(message.stats) if message.role == "assistant" else "")
        self.footer.setVisible(bool(self.footer.text()))
        self.set_context(message.stats if message.role == "assistant" else None)
        self._show_versions(message)

    def set_context(self, stats: dict | None) -> None:
        """Say what the context did to this reply: older messages left out, or the reply cut off."""
        lines = [context_note(stats)]
        if context_filled(stats):
            lines.append(CONTEXT_FULL_TEXT)
        text = " ".join(line for line in lines if line)
        self.note.setText(text)
        self.note.setVisible(bool(text))

    def show_stream(
        self, text: str, thought: str, thought_seconds: float | None, origins: list[list], thinking: bool
    ) -> None:
        """Show a reply while it streams."""
        self.streaming = True
        self._origins = origins
        self._set_thought(thought, thought_seconds, thinking)
        self._set_body(text)
        self._set_state(STREAMING, None, waiting=not (text or thought))

    def _set_body(self, text: str) -> None:
        self.message.content = text
        if self.message.role == "user":
            self.body.set_plain(text)
        else:
            self.body.set_markdown(text, self._origins if self.colour_by_origin else None)
        self.body.setVisible(bool(text) or not self.streaming)

    def _set_thought(self, thought: str, seconds: float | None, thinking: bool) -> None:
        self.message.thought, self.message.thought_seconds = thought, seconds
        has = bool(thought)
        self.thought_toggle.setVisible(has)
        if not has:
            self.thought_view.hide()
            return
        if thinking:
            label = f"Thinking… {seconds:.1f} s" if seconds is not None else "Thinking…"
        else:
            label = f"Thought for {seconds:.1f} s" if seconds is not None else "Thought"
        open_ = self.thought_open or thinking
        self.thought_toggle.setText(("▾ " if open_ else "▸ ") + label)
        self.thought_toggle.setToolTip("Show or hide the model's thought")
        self.thought_view.setVisible(open_)
        if open_:
            self.thought_view.set_markdown(thought)

    def _set_state(self, state: str, error: str | None, waiting: bool = False) -> None:
        """The line under a reply: how it ended, or, streaming before its first token, that it waits
        (for the prompt's prefill, or behind a request to the API server)."""
        text = WAITING_TEXT if waiting else STATE_TEXT.get(state, "")
        if state == FAILED and error:
            text = f"This reply failed: {error}"
        self.status.setText(text)
        self.status.setVisible(bool(text))

    def toggle_thought(self) -> None:
        self.thought_open = not self.thought_open
        self._set_thought(self.message.thought, self.message.thought_seconds, thinking=False)

    def set_colour_by_origin(self, on: bool) -> None:
        self.colour_by_origin = on
        self._set_body(self.message.content)

    def set_actions_enabled(self, on: bool) -> None:
        for button in (self.edit_button, self.regen_button):
            button.setEnabled(on)
        self.versions_row.setEnabled(on)  # the arrows keep their own ends (no version before the first)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.message.content)
        copied(self.copy_button, "Copied the message")

    # -- editing -------------------------------------------------------------------------------------

    def start_edit(self) -> None:
        self.editor.setPlainText(self.message.content)
        self.body.hide()
        self.editor.show()
        self.edit_row.show()
        self.editor.setFocus()
        self.edit_started.emit(self.message.id)

    def cancel_edit(self) -> None:
        self.editor.hide()
        self.edit_row.hide()
        self.body.show()

    def _submit_edit(self) -> None:
        text = self.editor.toPlainText().strip()
        if not text:
            return
        self.cancel_edit()
        self.edit_submitted.emit(self.message.id, text)
