"""The sidebar: search by title, the conversations (newest first), new, rename, delete.

Keyboard: Ctrl+N new (window shortcut), Ctrl+F search, F2 renames and Delete deletes the selected
conversation while the list has focus.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QLineEdit, QListWidget, QListWidgetItem,
                               QMessageBox, QPushButton, QVBoxLayout, QWidget)

from flashdesk.app.store import Conversation

ID_ROLE = Qt.ItemDataRole.UserRole


class _List(QListWidget):
    """The list itself: Delete asks to delete the selected conversation (F2 edits, as Qt's lists do)."""

    delete_pressed = Signal()

    def keyPressEvent(self, event) -> None:  # noqa: N802 - Qt's name
        if event.key() == Qt.Key.Key_Delete and self.state() != QAbstractItemView.State.EditingState:
            self.delete_pressed.emit()
            return
        super().keyPressEvent(event)


class ConversationList(QWidget):
    selected = Signal(int)
    new_requested = Signal()
    renamed = Signal(int, str)
    deleted = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("conversationList")
        self.confirm_delete = self._ask  # replaced in tests
        self.search = QLineEdit()
        self.search.setObjectName("search")
        self.search.setPlaceholderText("Search titles (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.list = _List()
        self.list.setObjectName("conversations")
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed
                                  | QAbstractItemView.EditTrigger.DoubleClicked)
        self.list.setUniformItemSizes(True)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long titles end in …
        self.new_button = QPushButton("New")
        self.new_button.setToolTip("New conversation (Ctrl+N)")
        self.rename_button = QPushButton("Rename")
        self.rename_button.setToolTip("Rename the selected conversation (F2)")
        self.delete_button = QPushButton("Delete")
        self.delete_button.setToolTip("Delete the selected conversation (Delete)")
        buttons = QHBoxLayout()
        buttons.setSpacing(4)
        for button in (self.new_button, self.rename_button, self.delete_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addLayout(buttons)

        self._filling = False
        self.new_button.clicked.connect(self.new_requested)
        self.rename_button.clicked.connect(self.rename_current)
        self.delete_button.clicked.connect(self.delete_current)
        self.list.delete_pressed.connect(self.delete_current)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemChanged.connect(self._item_changed)

    def fill(self, conversations: list[Conversation], current: int | None) -> None:
        self._filling = True
        self.list.clear()
        for conv in conversations:
            item = QListWidgetItem(conv.title)
            item.setData(ID_ROLE, conv.id)
            item.setToolTip(conv.title)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if conv.id == current:
                self.list.setCurrentItem(item)
        self._filling = False
        has = self.list.currentItem() is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(ID_ROLE) if item else None

    def rename_current(self) -> None:
        item = self.list.currentItem()
        if item:
            self.list.setFocus()
            self.list.editItem(item)

    def delete_current(self) -> None:
        item = self.list.currentItem()
        if item and self.confirm_delete(item.text()):
            self.deleted.emit(item.data(ID_ROLE))

    def _ask(self, title: str) -> bool:
        answer = QMessageBox.question(self, "Delete conversation",
                                      f"Delete “{title}” and all its messages? This cannot be undone.")
        return answer == QMessageBox.StandardButton.Yes

    def _current_changed(self, item: QListWidgetItem | None, _previous) -> None:
        self.rename_button.setEnabled(item is not None)
        self.delete_button.setEnabled(item is not None)
        if item is not None and not self._filling:
            self.selected.emit(item.data(ID_ROLE))

    def _item_changed(self, item: QListWidgetItem) -> None:
        if self._filling:
            return
        title = item.text().strip()
        if title:
            self.renamed.emit(item.data(ID_ROLE), title)
