"""The scrolling list of messages of the open conversation.

It follows the end while a reply streams, unless the user scrolled up to read, in which case it
stays where they are. A search result opened in the sidebar scrolls to its message and marks it
for a moment (show_hit). In a wide window the messages keep to a centred column of a comfortable line
length (message_widget.column_width) instead of running across the whole screen.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QVBoxLayout, QWidget

from flashdesk.app.chat.message_widget import MessageWidget, column_width
from flashdesk.app.history.store import Message

EMPTY_TEXT = "Write a message below and press Enter to send it (Shift+Enter for a new line)."
SIDE_MARGIN = 16
END_MARGIN = 12
HIT_MARK_MS = 2500  # how long a search hit's message stays marked


class _Column(QWidget):
    """The messages' column: the view's width up to column_width, centred."""

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        side = max(SIDE_MARGIN, (self.width() - column_width(self.font())) // 2)
        self.layout().setContentsMargins(side, END_MARGIN, side, END_MARGIN)


class ChatView(QScrollArea):
    edit_submitted = Signal(int, str)
    regenerate_requested = Signal(int)
    version_requested = Signal(int, int)  # message id, -1 or +1

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("chatView")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.colour_by_origin = False
        self.widgets: dict[int, MessageWidget] = {}
        self._follow = True
        self._hit: int | None = None  # the message a search result asked for, until it is in view
        inner = _Column()
        inner.setObjectName("chatInner")
        self.column = QVBoxLayout(inner)
        self.column.setContentsMargins(SIDE_MARGIN, END_MARGIN, SIDE_MARGIN, END_MARGIN)
        self.column.setSpacing(10)
        self.empty = QLabel(EMPTY_TEXT)
        self.empty.setObjectName("emptyHint")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.column.addWidget(self.empty)
        self.column.addStretch(1)
        self.setWidget(inner)
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._range_changed)
        bar.valueChanged.connect(self._scrolled)

    def set_messages(self, messages: list[Message]) -> None:
        for widget in self.widgets.values():
            widget.setParent(None)
            widget.deleteLater()
        self.widgets.clear()
        for message in messages:
            if message.role != "system":
                self.add(message)
        self._update_empty()
        self._follow = True
        self._hit = None

    def editing(self) -> bool:
        """Whether a message's editor is open (rebuilding the view would lose what is typed in it)."""
        return any(w.editor.isVisibleTo(w) for w in self.widgets.values())

    def add(self, message: Message) -> MessageWidget:
        if message.id in self.widgets:  # a reply written on (Continue): followed as it grows, as a new one
            self._follow = True
            return self.widgets[message.id]
        widget = MessageWidget(message, self.colour_by_origin)
        widget.edit_submitted.connect(self.edit_submitted)
        widget.edit_started.connect(self._edit_started)
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.version_requested.connect(self.version_requested)
        self.column.insertWidget(self.column.count() - 1, widget)
        self.widgets[message.id] = widget
        self._update_empty()
        self._follow = True
        self._hit = None
        return widget

    def _edit_started(self, message_id: int) -> None:
        """An editor opened: say that saving loses nothing, and bring it into view."""
        ids = list(self.widgets)
        later = len(ids) - ids.index(message_id) - 1
        widget = self.widgets[message_id]
        follows = f", with the {later} message{'s' if later != 1 else ''} after it," if later else ""
        widget.edit_note.setText(
            f"Saving sends it as a new version. This version{follows} stays: ‹ › on the message goes back to it."
        )
        self._follow = False
        QTimer.singleShot(0, widget, lambda: self.ensureWidgetVisible(widget.edit_row, 0, END_MARGIN))

    def widget(self, message_id: int) -> MessageWidget | None:
        return self.widgets.get(message_id)

    def show_hit(self, message_id: int, words: list[str] | None = None) -> bool:
        """Scroll to this message (a search hit) and mark it for a moment, the search's `words`
        highlighted in it; False when it is not shown (in a branch not shown,
        or not in this conversation)."""
        widget = self.widgets.get(message_id)
        if widget is None:
            return False
        self._follow = False  # stay on the hit, not at the end
        self._hit = message_id
        self._scroll_to_hit()
        QTimer.singleShot(0, self._scroll_to_hit)  # again once the new messages are laid out
        widget.set_marked(True, words)
        QTimer.singleShot(HIT_MARK_MS, self, lambda: self._unmark(message_id))  # not after the view is gone
        return True

    def _unmark(self, message_id: int) -> None:
        if message_id in self.widgets:
            self.widgets[message_id].set_marked(False)
        if self._hit == message_id:
            self._hit = None

    def _scroll_to_hit(self) -> None:
        widget = self.widgets.get(self._hit) if self._hit is not None else None
        if widget is not None:
            self.ensureWidgetVisible(widget, 0, END_MARGIN)

    def remove_from(self, message_id: int) -> None:
        """Remove this message and every later one."""
        for mid in [m for m in self.widgets if m >= message_id]:
            widget = self.widgets.pop(mid)
            widget.setParent(None)
            widget.deleteLater()
        self._update_empty()

    def set_colour_by_origin(self, on: bool) -> None:
        self.colour_by_origin = on
        for widget in self.widgets.values():
            widget.set_colour_by_origin(on)

    def set_busy(self, busy: bool) -> None:
        for widget in self.widgets.values():
            widget.set_actions_enabled(not busy)

    def refresh_style(self) -> None:
        for widget in self.widgets.values():
            widget.apply_style()
            if not widget.streaming:
                widget.show_message(widget.message)

    def _update_empty(self) -> None:
        self.empty.setVisible(not self.widgets)

    def _range_changed(self, _low: int, high: int) -> None:
        if self._hit is not None:
            self._scroll_to_hit()
        elif self._follow:
            self.verticalScrollBar().setValue(high)

    def _scrolled(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 8
