"""The side panel folded to a slim strip of icons at the chat's right edge.

Why: the speculation, telemetry and API server panels are what FlashDesk is for, but the chat is
what a user reads. Hidden (by choice, or because the window is too narrow for both), the panel
leaves this strip: one click on an icon brings it back scrolled to that part, so nothing is ever
out of reach and the chat keeps its width.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Signal
from PySide6.QtWidgets import QToolButton, QVBoxLayout, QWidget

from flashdesk.app import theme

# (section, icon, tooltip): the side panel's parts, top to bottom
SECTIONS = (
    ("spec", "speculation", "Speculation: method, draft length, acceptance"),
    ("telemetry", "telemetry", "Speed, memory and power"),
    ("server", "server", "API server for other programs"),
)
STRIP_WIDTH = 40


class SideStrip(QWidget):
    section_requested = Signal(str)  # "spec", "telemetry", "server" or "" (the panel at its top)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("sideStrip")
        self.setFixedWidth(STRIP_WIDTH)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 10, 4, 10)
        layout.setSpacing(6)
        self.buttons: dict[str, QToolButton] = {}
        for section, icon, tip in (("", "side-panel", "Show or hide the side panel (Ctrl+Shift+S)"), *SECTIONS):
            button = QToolButton()
            button.setObjectName(f"strip_{section or 'open'}")
            button.setAutoRaise(True)
            button.setIconSize(QSize(20, 20))
            button.setToolTip(tip)
            button.setAccessibleName(tip)
            button.clicked.connect(lambda _on=False, s=section: self.section_requested.emit(s))
            layout.addWidget(button)
            self.buttons[section] = button
        layout.addStretch(1)
        self.apply_theme()

    def apply_theme(self) -> None:
        icons = {"": "side-panel", **{section: icon for section, icon, _tip in SECTIONS}}
        for section, button in self.buttons.items():
            button.setIcon(theme.icon(icons[section]))
