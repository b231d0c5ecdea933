"""Where the side panel goes as the window's width changes: docked beside the chat, folded to its
strip of icons, or over the chat as a drawer.

Why apart: the speculation, telemetry and server panels need about 340 px, the conversation list
260 and the chat at least 560 to read. Below NARROW_WINDOW px there is no room for all three, so
the panel folds to the strip (app/side_strip.py) and the chat keeps its width. Asked for there (an
icon of the strip, View → Show the side panel), it opens as a drawer over the chat's right side,
and the window keeps its size: docking it would push the window past a small screen's edge. Wide
again, it docks as the user last chose (remembered as the "side_panel" setting).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPoint, Signal
from PySide6.QtWidgets import QGraphicsDropShadowEffect, QScrollArea, QSplitter, QStackedWidget, QWidget

NARROW_WINDOW = 1100  # px: below this the docked side panel leaves the chat too little
DRAWER_WIDTH = (340, 420)  # px: its narrowest and widest, over the chat


class SideArea(QObject):
    drawer_changed = Signal(bool)  # open over the chat (Esc closes it)

    def __init__(self, window: QWidget, splitter: QSplitter, panel: QScrollArea, strip: QWidget, action, store):
        super().__init__(window)
        self.window, self.splitter, self.panel, self.strip = window, splitter, panel, strip
        self.action, self.store = action, store
        self.pages: QStackedWidget = splitter.parentWidget()  # the window's pages: the drawer lies over them
        self.wanted = bool(store.setting("side_panel", True))  # docked where it fits: the kept choice
        self.drawer = False  # open over the chat in a narrow window
        self.pages.currentChanged.connect(lambda _index: self.fit())
        self.pages.installEventFilter(self)  # its resizes move the drawer

    @property
    def narrow(self) -> bool:
        return self.window.width() < NARROW_WINDOW

    def set_shown(self, shown: bool) -> None:
        """The user's choice (the menu, an icon of the strip): in a wide window it docks or goes, and
        is kept; in a narrow one it opens or closes the drawer (opened, the choice kept is to show it)."""
        if self.narrow:
            if self.drawer != shown:
                self.drawer = shown
                self.drawer_changed.emit(shown)
            if shown:
                self._keep(True)
        else:
            self._keep(shown)
        self.fit()

    def _keep(self, shown: bool) -> None:
        self.wanted = shown
        self.store.set_setting("side_panel", shown)

    def fit(self) -> None:
        """Dock, fold or draw the panel for the window's width now."""
        narrow = self.narrow
        if not narrow and self.drawer:
            self.drawer = False
            self.drawer_changed.emit(False)
        on_chat = self.pages.currentWidget() is self.splitter
        docked = self.wanted and not narrow
        drawn = self.drawer and on_chat
        was_shown = not self.panel.isHidden()
        self.strip.setVisible(not docked)
        self._place(drawn)
        self.panel.setVisible(docked or drawn)
        self.action.setChecked(docked or self.drawer)
        if was_shown and not (docked or drawn) and self.wanted and narrow:
            self.window.statusBar().showMessage(
                "The side panel is folded to the icons at the right to give the chat room: an icon, "
                "or View → Show the side panel (Ctrl+Shift+S), opens it over the chat",
                10_000,
            )

    def _place(self, drawn: bool) -> None:
        """The panel as the splitter's last column, or a drawer over the right of the chat page."""
        if drawn:
            if self.panel.parentWidget() is not self.pages:
                self.panel.setParent(self.pages)
                shadow = QGraphicsDropShadowEffect(self.panel)
                shadow.setBlurRadius(24)
                shadow.setOffset(-2, 0)
                self.panel.setGraphicsEffect(shadow)
                self.panel.setAutoFillBackground(True)
            # left of the strip, whose icons go on opening its parts and closing it
            right = self.strip.mapTo(self.pages, QPoint(0, 0)).x() if self.strip.isVisible() else self.pages.width()
            width = max(DRAWER_WIDTH[0], min(DRAWER_WIDTH[1], self.pages.width() * 45 // 100))
            self.panel.setGeometry(right - width, 0, width, self.pages.height())
            self.panel.raise_()
        elif self.panel.parentWidget() is not self.splitter:
            self.panel.setGraphicsEffect(None)
            self.panel.setAutoFillBackground(False)
            self.splitter.insertWidget(2, self.panel)

    def eventFilter(self, obj, event) -> bool:
        if obj is self.pages and event.type() == QEvent.Type.Resize and self.drawer:
            self._place(True)
        return False
