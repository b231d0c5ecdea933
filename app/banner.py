"""A strip above the chat that says something important (the engine stopped, a database was moved
aside, the demo model is loaded) with an optional action button and a close button."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from flashdesk.app import theme


class Banner(QFrame):
    action = Signal()

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
        self.close_button = QToolButton(self)
        self.close_button.setText("✕")
        self.close_button.setToolTip("Dismiss")
        self.close_button.setAutoRaise(True)
        self.close_button.clicked.connect(self.hide)
        self.close_button.setVisible(closable)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 6, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignVCenter)
        layout.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.kind = "info"
        self.hide()

    def show_text(self, text: str, action: str | None = None, kind: str = "info") -> None:
        self.kind = kind
        self.label.setText(text)
        self.button.setText(action or "")
        self.button.setVisible(bool(action))
        self.apply_theme()
        self.show()

    def apply_theme(self) -> None:
        c = theme.colors()
        border = c["error"] if self.kind == "error" else c["muted"]
        self.setStyleSheet(f"QFrame#{self.objectName()} {{ background: {c['warn_bg']}; "
                           f"border: 1px solid {border}; border-radius: 6px; }}")
