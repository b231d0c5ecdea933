"""The app's text size (Settings): one point size for the whole app, applied at once; None is the
system's.

Why the application font: Qt hands it to every widget that sets none of its own, so one call resizes
the window's text. Widgets that scale a font of their own from it when they are built (a reply's
text, headings) take the new size when built again: the window builds the chat again after a change.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QApplication

SIZE_RANGE = (7, 28)  # points: from dense to reading across the room
_SYSTEM_SIZE = "flashdesk_system_point_size"  # the application's property: the size it started with
_FALLBACK = 10.0  # a system font sized in pixels has no point size to go back to


def system_size() -> float:
    """The point size the app started with (the system's), kept the first time it is asked for."""
    app = QApplication.instance()
    kept = app.property(_SYSTEM_SIZE)
    if kept is None:
        size = app.font().pointSizeF()
        kept = size if size > 0 else _FALLBACK
        app.setProperty(_SYSTEM_SIZE, kept)
    return float(kept)


def clamp(points) -> int | None:
    """A kept size within SIZE_RANGE (a database edited by hand), or None for the system's."""
    if not isinstance(points, (int, float)) or isinstance(points, bool) or points <= 0:
        return None
    return int(min(max(points, SIZE_RANGE[0]), SIZE_RANGE[1]))


def apply(points: int | None) -> None:
    """Every widget's text at `points` (None: the system's size), now."""
    app = QApplication.instance()
    base = system_size()
    font = QFont(app.font())
    font.setPointSizeF(float(points) if points else base)
    app.setFont(font)
    for window in app.topLevelWidgets():  # Qt tells open windows only once its event loop runs
        QApplication.sendEvent(window, QEvent(QEvent.Type.ApplicationFontChange))


def current() -> float:
    return QApplication.instance().font().pointSizeF()
