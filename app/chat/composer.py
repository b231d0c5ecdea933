"""The input at the bottom of the chat: Enter sends, Shift+Enter is a new line, one button that is
Send while idle and Stop while a reply streams. Esc stops: here, and anywhere in the window through
the window's shortcut. Under it, a gauge of the context the conversation and the text being typed
take ("N / LIMIT tokens"), coloured as it nears and passes the limit; app/chat/context_gauge.py counts."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from flashdesk.app import theme

GAUGE_COLOURS = {"near": "warn", "over": "error"}  # gauge level -> theme colour (else muted)


class PromptEdit(QPlainTextEdit):
    submitted = Signal()
    escaped = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("prompt")
        self.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().documentLayout().documentSizeChanged.connect(lambda _size: self._fit())
        self._fit()

    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Escape:
            self.escaped.emit()
            return
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        if enter:  # Shift+Enter: a plain new line, not Qt's line separator
            self.insertPlainText("\n")
            return
        super().keyPressEvent(event)

    def _fit(self) -> None:
        """Grow with the text from one line up to eight, then scroll."""
        lines = max(1, min(8, int(self.document().size().height())))
        line = self.fontMetrics().lineSpacing()
        margins = self.contentsMargins().top() + self.contentsMargins().bottom()
        self.setFixedHeight(lines * line + 2 * int(self.document().documentMargin()) + margins + 4)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    blocked = Signal(str)  # Enter with text while nothing can be sent: why (the text stays in the box)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.busy = False
        self.edit = PromptEdit()
        self.button = QPushButton("Send")
        self.button.setObjectName("sendButton")
        self.button.setDefault(False)
        self.button.setAutoDefault(False)
        self.button.setMinimumWidth(84)
        self.gauge = QLabel()
        self.gauge.setObjectName("tokenGauge")
        self.gauge.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.gauge.hide()
        self.gauge_level = ""
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.edit, 1)
        row.addWidget(self.button, 0, Qt.AlignmentFlag.AlignBottom)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 6, 16, 8)
        layout.setSpacing(2)
        layout.addLayout(row)
        layout.addWidget(self.gauge)
        self.edit.submitted.connect(self._submit)
        self.edit.escaped.connect(lambda: self.stop_requested.emit() if self.busy else None)
        self.button.clicked.connect(self._clicked)
        self.edit.textChanged.connect(self._update)
        self.can_send = True
        self.why_not = ""

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.button.setText("Stop (Esc)" if busy else "Send")
        self._update()

    def set_can_send(self, on: bool, why: str = "") -> None:
        self.can_send, self.why_not = on, "" if on else why
        self.edit.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)" if on else why)
        self._update()

    def has_text(self) -> bool:
        return bool(self.edit.toPlainText().strip())

    def set_gauge(self, text: str | None, level: str = "", tip: str = "") -> None:
        """Show the context gauge (None hides it); level "near" or "over" colours it."""
        self.gauge_level = level
        if text is None:
            self.gauge.hide()
            return
        self.gauge.setText(text)
        self.gauge.setToolTip(tip)
        colour = theme.colors()[GAUGE_COLOURS.get(level, "muted")]
        weight = "bold" if level == "over" else "normal"
        self.gauge.setStyleSheet(f"QLabel#tokenGauge {{ color: {colour}; font-weight: {weight}; }}")
        self.gauge.show()

    def apply_theme(self) -> None:
        if self.gauge.isVisible():
            self.set_gauge(self.gauge.text(), self.gauge_level, self.gauge.toolTip())

    def _update(self) -> None:
        """Send only with something to send (not just spaces) and an engine to take it."""
        self.button.setEnabled(self.busy or (self.can_send and self.has_text()))
        self.button.setToolTip(
            "Stop the reply (Esc)" if self.busy else "Send (Enter)" if self.can_send else self.why_not
        )

    def _clicked(self) -> None:
        if self.busy:
            self.stop_requested.emit()
        else:
            self._submit()

    def _submit(self) -> None:
        text = self.edit.toPlainText().strip()
        if self.busy or not text:
            return
        if not self.can_send:  # not silently: the window says why and how to get going again
            self.blocked.emit(self.why_not)
            return
        self.edit.clear()
        self.send_requested.emit(text)
