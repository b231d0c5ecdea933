"""A strip above the chat that says something important (the engine stopped, a database was moved
aside, the demo model is loaded) with up to two action buttons and a close button. The text has
the strip's whole width; the buttons sit on their own row under it, so they never squeeze it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QVBoxLayout, QWidget

from flashdesk.app import theme


class Banner(QFrame):
    action = Signal()
    action2 = Signal()  # the second button's

    def __init__(self, name: str, closable: bool = True, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName(name)
        self.label = QLabel(self)
        self.label.setObjectName(f"{name}Text")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.button = QPushButton(self)
        self.button.setObjectName(f"{name}Button")
        self.button.clicked.connect(self.action)
        self.button.clicked.connect(lambda: self._chose(0))
        self.button2 = QPushButton(self)
        self.button2.setObjectName(f"{name}Button2")
        self.button2.clicked.connect(self.action2)
        self.button2.clicked.connect(lambda: self._chose(1))
        self.button2.hide()
        self.close_button = QToolButton(self)
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self.hide)
        self.close_button.setVisible(closable)
        top = QHBoxLayout()
        top.addWidget(self.label, 1)
        top.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.buttons = QWidget(self)
        row = QHBoxLayout(self.buttons)
        row.setContentsMargins(0, 0, 0, 0)
        row.addStretch(1)
        row.addWidget(self.button)
        row.addWidget(self.button2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 6, 6, 6)
        layout.addLayout(top)
        layout.addWidget(self.buttons)
        self.kind = "info"
        self._choices: list = []  # show_choice's callables, one a button
        self.hide()

    def show_text(self, text: str, action: str | None = None, kind: str = "info", action2: str | None = None) -> None:
        """Show `text`; the buttons' clicks come out as the `action` and `action2` signals."""
        self._choices = []
        self.kind = kind
        self.label.setText(text)
        self.button.setText(action or "")
        self.button.setVisible(bool(action))
        self.button2.setText(action2 or "")
        self.button2.setVisible(bool(action2))
        self.buttons.setVisible(bool(action or action2))
        self.apply_theme()
        self.show()

    def show_choice(self, text: str, first: tuple, second: tuple, kind: str = "info") -> None:
        """Show `text` with two buttons, each a (label, callable) run when it is pressed."""
        self.show_text(text, first[0], kind, second[0])
        self._choices = [first[1], second[1]]

    def _chose(self, index: int) -> None:
        choices = getattr(self, "_choices", [])
        if index < len(choices):
            choices[index]()

    def apply_theme(self) -> None:
        c = theme.colors()
        border = c["error"] if self.kind == "error" else c["muted"]
        self.setStyleSheet(
            f"QFrame#{self.objectName()} {{ background: {c['warn_bg']}; "
            f"border: 1px solid {border}; border-radius: 6px; }}"
        )
