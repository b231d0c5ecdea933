"""The Help menu's windows: the keyboard shortcuts (read from the menus themselves), About, the
documentation and Copy diagnostics.

A base class of the main window: each opens at most one window of its kind, beside the chat (not
modal), brought to the front when asked for again.
"""

from __future__ import annotations

from PySide6.QtGui import QDesktopServices, QKeySequence
from PySide6.QtWidgets import QMessageBox

from flashdesk.app.about import APP_NAME, about_text, documentation_url


class WindowHelp:
    def shortcut_lines(self) -> list[tuple[str, str]]:
        """(action, keys) of every menu entry with a shortcut, read from the menus themselves."""
        lines = []
        for menu_action in self.menuBar().actions():
            for act in menu_action.menu().actions():
                native = QKeySequence.SequenceFormat.NativeText
                keys = " or ".join(key.toString(native) for key in act.shortcuts())
                text = act.text().split("\t")
                keys = keys or (text[1] if len(text) > 1 else "")
                if keys:
                    lines.append((f"{menu_action.text().replace('&', '')} → {text[0].replace('&', '')}", keys))
        return lines

    def show_shortcuts(self) -> None:
        """Help → Keyboard shortcuts: every one, in a window that stays beside the chat."""
        rows = "".join(
            f"<tr><td>{name}</td><td>&nbsp;&nbsp;<b>{keys}</b></td></tr>" for name, keys in self.shortcut_lines()
        )
        self._show_box("shortcutsBox", "Keyboard shortcuts", f"<table>{rows}</table>")

    def show_about(self) -> None:
        info = self.engine.info
        text = about_text(info.name if info else None)
        self._show_box("aboutBox", f"About {APP_NAME}", text, QMessageBox.Icon.Information)

    def open_documentation(self) -> None:
        """Help → Documentation: the guides in the desktop's viewer, or where to find them."""
        url = documentation_url()
        if url is not None and QDesktopServices.openUrl(url):
            self.statusBar().showMessage(f"Opened {url.toDisplayString()}", 5000)
            return
        where = f"Nothing could open {url.toDisplayString()}." if url is not None else "This copy has no guides."
        self._show_box(
            "documentationBox",
            "Documentation",
            f"{where} The guides are the docs/ folder of FlashDesk's source; docs/app.md is the window, page by page.",
        )

    def _show_box(self, name: str, title: str, text: str, icon=QMessageBox.Icon.NoIcon) -> None:
        """A window beside the chat (not modal), one of each: asked for again, it comes to the front."""
        box = self.findChild(QMessageBox, name)
        if box is None:
            box = QMessageBox(icon, title, text, parent=self)
            box.setObjectName(name)
            box.setModal(False)
        box.setText(text)
        box.show()
        box.raise_()

    def copy_diagnostics(self) -> None:
        """Help > Copy diagnostics: the report to send when something fails, onto the clipboard."""
        if self.diagnostics.start():
            self.statusBar().showMessage("Collecting diagnostics…")

    def _diagnostics_done(self, copied: bool, text: str) -> None:
        self.statusBar().showMessage(text, 10_000)
        if not copied:
            self.notice_banner.show_text(text, kind="error")
