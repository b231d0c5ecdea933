"""The window's size, place and panel widths, kept for the next start.

Why apart: the main window only says when to save and restore; this keeps what is stored (Qt's
own geometry bytes as base64 text in the settings table, the splitter's widths as numbers) and
refuses what a screen change or an older version may have left (wrong types, a width of 0).
"""

from __future__ import annotations

import base64
import binascii

from PySide6.QtCore import QByteArray
from PySide6.QtWidgets import QMainWindow, QSplitter

SETTING = "window_layout"
DEFAULT_WIDTHS = (250, 760, 370)  # the chat page's columns: conversations, chat, side panel


def save(store, window: QMainWindow, splitter: QSplitter) -> None:
    """Keep the window's geometry and the widths of the chat page's columns (a hidden column, which
    has no width now, keeps the one it had when last shown)."""
    kept = store.setting(SETTING, {}) or {}
    before = kept.get("splitter") if isinstance(kept.get("splitter"), list) else []
    sizes = splitter.sizes()  # two only while the side panel is a drawer over the chat, out of the splitter
    widths = [
        (sizes[i] if i < len(sizes) else 0) or (before[i] if i < len(before) else DEFAULT_WIDTHS[i])
        for i in range(len(DEFAULT_WIDTHS))
    ]
    geometry = base64.b64encode(bytes(window.saveGeometry().data())).decode("ascii")
    store.set_setting(SETTING, {"geometry": geometry, "splitter": widths})


def restore(store, window: QMainWindow, splitter: QSplitter) -> bool:
    """Put the window back as it was left; False (the defaults stay) when nothing usable was kept."""
    kept = store.setting(SETTING, None)
    if not isinstance(kept, dict):
        return False
    done = False
    try:
        geometry = base64.b64decode(kept.get("geometry") or "", validate=True)
    except (binascii.Error, ValueError, TypeError):
        geometry = b""
    if geometry:
        done = window.restoreGeometry(QByteArray(geometry))
    widths = kept.get("splitter")
    usable = isinstance(widths, list) and len(widths) == splitter.count() == len(DEFAULT_WIDTHS)
    if usable and all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
        splitter.setSizes(widths)
        done = True
    return done
