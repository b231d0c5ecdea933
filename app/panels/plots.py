"""Small pyqtgraph plots in the window's colours: bars (acceptance) and last-minute lines (telemetry).

Why here: pyqtgraph must be told to use PySide6 before its first import, and every plot needs the
same theming, sizing and non-interactive setup (these are readouts, not zoomable charts).
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSizePolicy

from flashdesk.app import theme

pg.setConfigOptions(antialias=True, useOpenGL=False)


class Plot(pg.PlotWidget):
    """A compact, non-interactive plot with a title, themed from the current palette."""

    def __init__(self, title: str, height: int = 120, parent=None):
        super().__init__(parent=parent)
        self.title = title
        self.setMinimumHeight(height)
        self.setMaximumHeight(int(height * 1.6))
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.setMenuEnabled(False)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        item = self.getPlotItem()
        item.setContentsMargins(2, 2, 6, 2)
        self.apply_theme()

    def apply_theme(self) -> None:
        c = theme.colors()
        self.setBackground(c["plot_bg"])
        item = self.getPlotItem()
        item.setTitle(self.title, color=c["plot_fg"], size="9pt")
        for name in ("left", "bottom"):
            axis = item.getAxis(name)
            axis.setPen(pg.mkPen(c["plot_fg"]))
            axis.setTextPen(pg.mkPen(c["plot_fg"]))


class BarPlot(Plot):
    """Bars at integer x; `set_bars(xs, heights)`."""

    def __init__(
        self,
        title: str,
        x_label: str,
        y_range: tuple[float, float] | None = None,
        height: int = 120,
        color_key: str = "bar",
        parent=None,
    ):
        super().__init__(title, height, parent)
        self.color_key = color_key
        self.y_range = y_range
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.75, brush=theme.colors()[color_key], pen=None)
        self.addItem(self.bars)
        self.getPlotItem().setLabel("bottom", x_label, color=theme.colors()["plot_fg"])
        if y_range:
            self.setYRange(*y_range, padding=0.02)

    def set_bars(self, xs: list[float], heights: list[float]) -> None:
        self.bars.setOpts(x=list(xs), height=list(heights), width=0.75, brush=theme.colors()[self.color_key])
        if xs:
            self.setXRange(min(xs) - 0.6, max(xs) + 0.6, padding=0)
        if not self.y_range:
            self.setYRange(0, max([1.0] + list(heights)) * 1.1, padding=0)

    def apply_theme(self) -> None:
        super().apply_theme()
        if hasattr(self, "bars"):
            self.bars.setOpts(brush=theme.colors()[self.color_key])


class TimePlot(Plot):
    """One line over the last `window` seconds; x is seconds before now. A None value is a gap:
    the line breaks there rather than claiming a value nobody measured."""

    def __init__(self, title: str, window: float = 60.0, height: int = 110, color_key: str = "bar2", parent=None):
        super().__init__(title, height, parent)
        self.window = window
        self.color_key = color_key
        self.curve = self.plot([], [], pen=pg.mkPen(theme.colors()[color_key], width=2))
        self.setXRange(-window, 0, padding=0)
        self.getPlotItem().setLabel("bottom", "seconds ago", color=theme.colors()["plot_fg"])

    def set_points(self, xs: list[float], ys: list[float | None]) -> None:
        values = [math.nan if v is None else float(v) for v in ys]
        self.curve.setData(xs, values, connect="finite")
        top = max([v for v in values if math.isfinite(v)] + [0.0])
        self.setYRange(0, top * 1.15 if top > 0 else 1.0, padding=0)  # all zero (idle): a plain 0..1 axis

    def apply_theme(self) -> None:
        super().apply_theme()
        if hasattr(self, "curve"):
            self.curve.setPen(pg.mkPen(theme.colors()[self.color_key], width=2))


class GroupedBarPlot(Plot):
    """Bars in groups (one per label on the x axis), one colour per series, a legend, and a dashed
    reference line (the bench: speedup over AR by task type, one series per DFlash mode, a line at 1)."""

    def __init__(self, title: str, y_label: str, reference: float | None = None, height: int = 220, parent=None):
        super().__init__(title, height, parent)
        self.setMaximumHeight(16777215)
        self.reference = reference
        self.items: list = []
        self.legend = self.getPlotItem().addLegend(offset=(8, 4), labelTextColor=theme.colors()["plot_fg"])
        self.getPlotItem().setLabel("left", y_label, color=theme.colors()["plot_fg"])

    def set_groups(self, groups: list[str], series: list[tuple[str, list[float], str]]) -> None:
        """`series`: (name, one value per group, colour)."""
        for item in self.items:
            self.removeItem(item)
        self.legend.clear()
        self.legend.setColumnCount(max(1, len(series)))  # one row: it fits the headroom above the bars
        self.items = []
        width = 0.8 / max(1, len(series))
        for j, (name, values, color) in enumerate(series):
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(groups))]
            bars = pg.BarGraphItem(x=xs, height=values, width=width * 0.92, brush=color, pen=None, name=name)
            self.addItem(bars)
            self.items.append(bars)
        if self.reference is not None and groups:
            line = pg.InfiniteLine(
                pos=self.reference,
                angle=0,
                pen=pg.mkPen(theme.colors()["plot_fg"], width=1, style=Qt.PenStyle.DashLine),
            )
            self.addItem(line)
            self.items.append(line)
        self.getPlotItem().getAxis("bottom").setTicks([list(enumerate(groups))])
        top = max([self.reference or 0.0] + [v for _, values, _ in series for v in values] + [0.1])
        self.setXRange(-0.6, len(groups) - 0.4, padding=0)
        self.setYRange(0, top * 1.3, padding=0)  # headroom for the legend
