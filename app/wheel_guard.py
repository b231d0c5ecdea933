"""Spin boxes and combo boxes that a passing mouse wheel does not change.

Scrolling a page over a field must scroll the page, not silently change the context length or the
device under the pointer (Qt's default). A guarded field takes the wheel only once it has focus
(clicked or tabbed into); before that, the wheel scrolls the page around it.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QWidget


class _WheelGuard(QObject):
    def eventFilter(self, obj, event) -> bool:
        if event.type() != QEvent.Type.Wheel or obj.hasFocus():
            return False
        area = obj.parentWidget()
        while area is not None and not isinstance(area, QAbstractScrollArea):
            area = area.parentWidget()
        if area is not None:  # the page scrolls as if the field were not there
            QApplication.sendEvent(area.verticalScrollBar(), event)
        return True


_GUARD = _WheelGuard()


def wheel_only_when_focused(*widgets: QWidget) -> None:
    """These fields change on the wheel only once they have focus; until then it scrolls their page."""
    for widget in widgets:
        widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        widget.installEventFilter(_GUARD)
