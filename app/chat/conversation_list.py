"""The sidebar: search (titles and message text), the conversations (newest first), new, rename, delete.

A search shows under each title the snippet of its first matching message, the hit in bold, and
says so when nothing matches rather than leaving the list blank; opening a result shows that
message (hit_chosen).

Keyboard: Ctrl+N new (window shortcut), Ctrl+F search, F2 renames and Delete deletes the selected
conversation while the list has focus.
"""

from __future__ import annotations

import html
import time

from PySide6.QtCore import QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QAbstractTextDocumentLayout, QColor, QPalette, QTextDocument
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from flashdesk.app import theme
from flashdesk.app.history.store import HIT_END, HIT_START, SearchHit

ID_ROLE = Qt.ItemDataRole.UserRole
SNIPPET_ROLE = Qt.ItemDataRole.UserRole + 1  # the snippet as rich text, on items of a search
HIT_ROLE = Qt.ItemDataRole.UserRole + 2  # the id of the message the snippet comes from
SNIPPET_LINES = 2


def short_date(stamp: float, now: float | None = None) -> str:
    """A time as a list shows it: the hour today, the day this year, else the date."""
    then, today = time.localtime(stamp), time.localtime(now if now is not None else time.time())
    if then[:3] == today[:3]:
        return time.strftime("%H:%M", then)
    if then.tm_year == today.tm_year:
        return f"{time.strftime('%b', then)} {then.tm_mday}"  # strftime's %-d is not on Windows
    return time.strftime("%Y-%m-%d", then)


def snippet_html(snippet: str) -> str:
    """A store snippet as rich text: the text escaped, each hit in bold."""
    return html.escape(snippet).replace(HIT_START, "<b>").replace(HIT_END, "</b>")


class _HitDelegate(QStyledItemDelegate):
    """Draws an item that has a snippet as its title (as usual, on the first line) over the snippet."""

    def paint(self, painter, option, index) -> None:
        snippet = index.data(SNIPPET_ROLE)
        if not snippet:
            super().paint(painter, option, index)
            return
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.displayAlignment = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop
        opt.widget.style().drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        text = self._text_rect(opt)
        text.setTop(text.top() + opt.fontMetrics.lineSpacing())
        doc = self._document(snippet, opt, text.width())
        selected = opt.state & QStyle.StateFlag.State_Selected
        context = QAbstractTextDocumentLayout.PaintContext()
        context.palette.setColor(
            QPalette.ColorRole.Text,
            opt.palette.color(  # quieter than the title
                QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.PlaceholderText
            ),
        )
        context.clip = QRectF(0, 0, text.width(), text.height())
        painter.save()
        painter.translate(text.topLeft())
        painter.setClipRect(context.clip)
        doc.documentLayout().draw(painter, context)
        painter.restore()

    def sizeHint(self, option, index) -> QSize:
        size = super().sizeHint(option, index)
        snippet = index.data(SNIPPET_ROLE)
        if snippet:
            opt = QStyleOptionViewItem(option)
            self.initStyleOption(opt, index)
            opt.rect = QRect(0, 0, self.parent().viewport().width(), size.height())  # as wide as the list
            height = self._document(snippet, opt, self._text_rect(opt).width()).size().height()
            size.setHeight(size.height() + min(round(height), SNIPPET_LINES * opt.fontMetrics.lineSpacing()))
        return size

    @staticmethod
    def _text_rect(opt: QStyleOptionViewItem) -> QRect:
        """Where the style writes the title, less the margin it leaves (so the snippet lines up)."""
        style = opt.widget.style()
        margin = style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, opt.widget) + 1
        rect = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, opt, opt.widget)
        return rect.adjusted(margin, 0, -margin, 0)

    @staticmethod
    def _document(snippet: str, option, width: int) -> QTextDocument:
        doc = QTextDocument()
        doc.setDocumentMargin(0)
        doc.setDefaultFont(option.font)
        doc.setHtml(snippet)
        doc.setTextWidth(max(width, 1))
        return doc


class _List(QListWidget):
    """The list itself: Delete asks to delete the selected conversation (F2 edits, as Qt's lists do)."""

    delete_pressed = Signal()

    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Delete and self.state() != QAbstractItemView.State.EditingState:
            self.delete_pressed.emit()
            return
        super().keyPressEvent(event)


class ConversationList(QWidget):
    selected = Signal(int)
    hit_chosen = Signal(int)  # a search result was opened: the id of its matching message
    new_requested = Signal()
    renamed = Signal(int, str)
    deleted = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("conversationList")
        self.confirm_delete = self._ask  # replaced in tests
        self.search = QLineEdit()
        self.search.setObjectName("search")
        self.search.setPlaceholderText("Search conversations (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.list = _List()
        self.list.setObjectName("conversations")
        self.list.setEditTriggers(
            QAbstractItemView.EditTrigger.EditKeyPressed | QAbstractItemView.EditTrigger.DoubleClicked
        )
        self.list.setResizeMode(QListView.ResizeMode.Adjust)  # snippets wrap again to a new width
        self.list.setItemDelegate(_HitDelegate(self.list))
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # long titles end in …
        self.new_button = QPushButton("New")
        self.new_button.setToolTip("New conversation (Ctrl+N)")
        self.rename_button = QPushButton("Rename")
        self.rename_button.setToolTip("Rename the selected conversation (F2)")
        self.delete_button = QPushButton("Delete")
        self.delete_button.setToolTip("Delete the selected conversation (Delete)")
        self.no_match = QLabel()
        self.no_match.setObjectName("noMatch")
        self.no_match.setTextFormat(Qt.TextFormat.PlainText)
        self.no_match.setWordWrap(True)
        self.no_match.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.no_match.hide()
        buttons = QHBoxLayout()
        buttons.setSpacing(4)
        for button in (self.new_button, self.rename_button, self.delete_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.no_match, 1)
        layout.addLayout(buttons)

        self._filling = False
        self.new_button.clicked.connect(self.new_requested)
        self.rename_button.clicked.connect(self.rename_current)
        self.delete_button.clicked.connect(self.delete_current)
        self.list.delete_pressed.connect(self.delete_current)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemClicked.connect(self._show_hit)  # again, when its conversation is already open
        self.list.itemChanged.connect(self._item_changed)

    def fill(self, hits: list[SearchHit], current: int | None, writing: int | None = None) -> None:
        """Show `hits` (the store's search for the search box's text), `current` selected; the
        conversation `writing` a reply now is marked."""
        self._filling = True
        self.list.clear()
        for hit in hits:
            conv = hit.conversation
            busy = conv.id == writing
            item = QListWidgetItem(conv.title)  # the title alone: it is what F2 edits
            item.setData(ID_ROLE, conv.id)
            if busy:  # marked apart from the title: italic, in the accent colour
                font = item.font()
                font.setItalic(True)
                item.setFont(font)
                item.setForeground(QColor(theme.colors()["accent"]))
                item.setIcon(theme.icon("regenerate"))
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(conv.updated))
            item.setToolTip(f"{conv.title}\nlast message {when}" + ("\nwriting a reply now" if busy else ""))
            if hit.snippet:  # a search: when, then the words around the hit
                item.setData(SNIPPET_ROLE, f"{html.escape(short_date(conv.updated))} · {snippet_html(hit.snippet)}")
                item.setData(HIT_ROLE, hit.message_id)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if conv.id == current:
                self.list.setCurrentItem(item)
        self._filling = False
        query = self.search.text().strip()
        self.no_match.setText(f"No conversation mentions “{query}”.")
        nothing = bool(query) and not hits
        self.no_match.setVisible(nothing)
        self.list.setVisible(not nothing)
        has = self.list.currentItem() is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)

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
        answer = QMessageBox.question(
            self, "Delete conversation", f"Delete “{title}” and all its messages? This cannot be undone."
        )
        return answer == QMessageBox.StandardButton.Yes

    def _current_changed(self, item: QListWidgetItem | None, _previous) -> None:
        self.rename_button.setEnabled(item is not None)
        self.delete_button.setEnabled(item is not None)
        if item is not None and not self._filling:
            hit = item.data(HIT_ROLE)  # read first: opening the conversation fills the list anew
            self.selected.emit(item.data(ID_ROLE))
            if hit is not None:
                self.hit_chosen.emit(hit)

    def _show_hit(self, item: QListWidgetItem) -> None:
        if item.data(HIT_ROLE) is not None:
            self.hit_chosen.emit(item.data(HIT_ROLE))

    def _item_changed(self, item: QListWidgetItem) -> None:
        if self._filling:
            return
        title = item.text().strip()
        if title:
            self.renamed.emit(item.data(ID_ROLE), title)
