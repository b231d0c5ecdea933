"""Light or dark, following the system; and the few colours of our own that must suit both.

Why Fusion with our palette: Qt's default style on a bare Linux desktop (or Xvfb) ignores the
desktop's dark preference, while `styleHints().colorScheme()` knows it (GNOME, KDE, Windows,
macOS). Fusion draws every widget from the palette, so one palette switch recolours the whole
window, also live when the system theme changes. The window's View → Theme (`set_choice`) or
FLASHDESK_THEME=light|dark overrides it.
"""

from __future__ import annotations

import os
from functools import lru_cache

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle, QStyleFactory

from flashdesk.paths import assets_dir

THEME_ENV = "FLASHDESK_THEME"
CHOICES = ("system", "light", "dark")
_choice = "system"  # the window's View → Theme
ICON_PIXELS = 48  # drawn at twice the usual 24 px: sharp on HiDPI screens, smooth when scaled down


def set_choice(choice: str) -> None:
    """Follow the system ("system"), or be "light" or "dark" whatever it says; applied at once."""
    global _choice
    if choice not in CHOICES:
        raise ValueError(f"theme: {choice!r} is not one of {', '.join(CHOICES)}")
    _choice = choice
    app = QApplication.instance()
    if app is not None:
        apply(app)


def is_dark() -> bool:
    if _choice != "system":
        return _choice == "dark"
    forced = os.environ.get(THEME_ENV, "").lower()
    if forced in ("light", "dark"):
        return forced == "dark"
    hints = QGuiApplication.styleHints()
    return hints.colorScheme() == Qt.ColorScheme.Dark


def dark_palette() -> QPalette:
    pal = QPalette()
    base, window, text = QColor(30, 31, 34), QColor(43, 45, 48), QColor(223, 225, 229)
    roles = {
        QPalette.ColorRole.Window: window,
        QPalette.ColorRole.WindowText: text,
        QPalette.ColorRole.Base: base,
        QPalette.ColorRole.AlternateBase: QColor(50, 52, 56),
        QPalette.ColorRole.ToolTipBase: window,
        QPalette.ColorRole.ToolTipText: text,
        QPalette.ColorRole.PlaceholderText: QColor(140, 143, 150),
        QPalette.ColorRole.Text: text,
        QPalette.ColorRole.Button: QColor(55, 57, 61),
        QPalette.ColorRole.ButtonText: text,
        QPalette.ColorRole.BrightText: QColor(255, 120, 120),
        QPalette.ColorRole.Highlight: QColor(53, 116, 240),
        QPalette.ColorRole.HighlightedText: QColor(255, 255, 255),
        QPalette.ColorRole.Link: QColor(110, 160, 255),
        QPalette.ColorRole.LinkVisited: QColor(170, 140, 255),
        QPalette.ColorRole.Mid: QColor(70, 72, 76),
        QPalette.ColorRole.Dark: QColor(25, 26, 28),
        QPalette.ColorRole.Light: QColor(75, 77, 82),
        QPalette.ColorRole.Midlight: QColor(62, 64, 68),
        QPalette.ColorRole.Shadow: QColor(10, 10, 10),
    }
    for role, color in roles.items():
        pal.setColor(role, color)
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        pal.setColor(QPalette.ColorGroup.Disabled, role, QColor(120, 122, 128))
    return pal


class FlashDeskStyle(QProxyStyle):
    """Fusion, with check box and radio button frames that show on a dark window. Fusion draws
    them in the window's colour darkened, which on a dark palette is a few shades from the window
    itself: an unchecked box all but disappears. The frame is drawn again in the muted text colour."""

    FRAMED = (QStyle.PrimitiveElement.PE_IndicatorCheckBox, QStyle.PrimitiveElement.PE_IndicatorRadioButton)

    def __init__(self):
        super().__init__(QStyleFactory.create("Fusion"))

    def drawPrimitive(self, element, option, painter, widget=None) -> None:
        super().drawPrimitive(element, option, painter, widget)
        if element not in self.FRAMED or not is_dark():
            return
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(QColor(colors()["muted"]))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        rect = QRectF(option.rect).adjusted(0.5, 0.5, -1.5, -1.5)
        if element == QStyle.PrimitiveElement.PE_IndicatorRadioButton:
            painter.drawEllipse(rect)
        else:
            painter.drawRoundedRect(rect, 2.0, 2.0)
        painter.restore()


def apply(app: QApplication) -> None:
    """Fusion (ours), with the palette of the current scheme; re-applied when the system scheme changes."""
    if not isinstance(app.style(), FlashDeskStyle):
        app.setStyle(FlashDeskStyle())
    app.setPalette(dark_palette() if is_dark() else app.style().standardPalette())
    if not app.property("flashdesk_theme_hooked"):
        app.setProperty("flashdesk_theme_hooked", True)
        app.styleHints().colorSchemeChanged.connect(lambda _scheme: apply(app))


def colors() -> dict[str, str]:
    """Our own colours for the current scheme (CSS names for rich text and plots)."""
    if is_dark():
        return {
            "draft_bg": "#1f5130",
            "draft_fg": "#c8f5d2",
            "code_bg": "#25272b",
            "muted": "#9a9ea6",
            "error": "#ff8a80",
            "user_bg": "#2f3a4d",
            "accent": "#6ea0ff",
            "plot_fg": "#c9ccd2",
            "plot_bg": "#1e1f22",
            "bar": "#5aa469",
            "bar2": "#6ea0ff",
            "warn_bg": "#4a3b1d",
            "warn": "#f0b45a",
        }
    return {
        "draft_bg": "#c9f0d3",
        "draft_fg": "#0b3d1a",
        "code_bg": "#f3f4f6",
        "muted": "#5f6368",
        "error": "#b3261e",
        "user_bg": "#e8effc",
        "accent": "#1a5fd0",
        "plot_fg": "#3c4043",
        "plot_bg": "#ffffff",
        "bar": "#2e8b57",
        "bar2": "#1a5fd0",
        "warn_bg": "#fff4d6",
        "warn": "#9a5b00",
    }


def icon(name: str) -> QIcon:
    """assets/icons/<name>.svg drawn in the current scheme's muted colour. Why by hand: QIcon draws
    an SVG in the colours written in it, so our icons say `currentColor` and get it here."""
    return _icon(name, colors()["muted"])


@lru_cache(maxsize=64)
def _icon(name: str, color: str) -> QIcon:
    svg = (assets_dir() / "icons" / f"{name}.svg").read_text(encoding="utf-8").replace("currentColor", color)
    pixmap = QPixmap(ICON_PIXELS, ICON_PIXELS)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    QSvgRenderer(QByteArray(svg.encode())).render(painter)
    painter.end()
    return QIcon(pixmap)
