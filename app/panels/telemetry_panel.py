"""The speed and telemetry panel: tok/s, time to first token, prefill speed, J/token, and the GPU's
VRAM, power, utilization, temperature and clocks, with plots of the last minute.

Every value is "n/a" on its own when it is unknown (the driver lacks it, nothing measured yet), so
one missing reading never hides the others. Without an NVIDIA GPU the panel says so in one line
(the driver's own words on hover) and shows the worker's RAM instead of VRAM and power. The plots
leave a gap for the time the engine was not running.

With a server as the engine, its GPU is not this computer's: the GPU rows and the power plot say
the GPU is remote instead of showing this computer's card as if it were the engine's, and a row
shows the server's own output tokens per second (all its requests, from its /metrics).
"""

from __future__ import annotations

from collections import deque

from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from flashdesk.app import theme
from flashdesk.app.panels.plots import TimePlot
from flashdesk.app.panels.telemetry import Sample

NA = "n/a"
GIB = 1024**3
HISTORY_S = 60.0
NO_GPU_TEXT = "No NVIDIA GPU found: GPU readouts are off."
GPU_ROWS = ("gpu_name", "vram", "worker_vram", "power", "util", "temp", "clocks")
REMOTE_PLOT_TITLE = "Power: n/a, the engine's GPU is remote"


def remote_text(host: str) -> str:
    return (
        f"The engine runs on the server at {host}: its GPU is not measured from here (no VRAM, power or "
        "clocks). The RAM below is this computer's."
    )


def gib(n: int | None) -> str:
    return f"{n / GIB:.2f} GiB" if isinstance(n, (int, float)) else NA


def num(value, fmt: str, unit: str = "") -> str:
    return f"{value:{fmt}}{unit}" if isinstance(value, (int, float)) else NA


def used_of(used: int | None, total: int | None) -> str:
    if used is None and total is None:
        return NA
    return f"{gib(used)} of {gib(total)}" if total is not None else gib(used)


class TelemetryPanel(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("telemetryPanel")
        self.values: dict[str, QLabel] = {}
        self.live_tps: float | None = None
        self.history: deque[tuple[float, float | None, float | None]] = deque()  # time, tok/s, second plot
        self.gpu_mode: bool | None = None
        self.gpu_problem: str | None = None
        self.remote_host: str | None = None  # the server's host:port while a server is the engine

        speed = QGroupBox("Speed")
        form = QFormLayout(speed)
        self._row(form, "tps_live", "Decode now")
        self._row(form, "tps_message", "Decode (reply)")
        self._row(form, "ttft", "First token")
        self._row(form, "prefill", "Prefill")
        self._row(form, "energy", "Energy (reply)")
        self._row(form, "tps_server", "Server output")
        self.values["tps_server"].setToolTip(
            "Tokens per second the server made for all its requests, from its /metrics"
        )
        form.setRowVisible(self.values["tps_server"], False)
        self.speed_form = form

        self.hardware = QGroupBox("GPU")
        hw = QFormLayout(self.hardware)
        self.notice = QLabel()
        self.notice.setObjectName("gpuNotice")
        self.notice.setWordWrap(True)
        hw.addRow(self.notice)
        self._row(hw, "gpu_name", "Device")
        self._row(hw, "vram", "VRAM")
        self._row(hw, "worker_vram", "VRAM (engine)")
        self._row(hw, "power", "Power")
        self._row(hw, "util", "Utilization")
        self._row(hw, "temp", "Temperature")
        self._row(hw, "clocks", "Clocks")
        self._row(hw, "worker_ram", "RAM (engine)")
        self._row(hw, "system_ram", "RAM (system)")
        self.hw_form = hw

        self.tps_plot = TimePlot("Decode tok/s, last minute", height=95, color_key="bar")
        self.tps_plot.setObjectName("tpsPlot")
        self.second_plot = TimePlot("Power (W), last minute", height=95)
        self.second_plot.setObjectName("powerPlot")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(speed)
        layout.addWidget(self.hardware)
        layout.addWidget(self.tps_plot)
        layout.addWidget(self.second_plot)
        self.apply_theme()
        self.set_live(None)

    def _row(self, form: QFormLayout, key: str, label: str) -> None:
        value = QLabel(NA)
        value.setObjectName(key)
        value.setWordWrap(True)
        self.values[key] = value
        form.addRow(label, value)

    def _set_row_visible(self, key: str, visible: bool) -> None:
        self.hw_form.setRowVisible(self.values[key], visible)

    def apply_theme(self) -> None:
        c = theme.colors()
        self.notice.setStyleSheet(f"background: {c['warn_bg']}; padding: 6px; border-radius: 6px;")
        for plot in (self.tps_plot, self.second_plot):
            plot.apply_theme()

    def text(self, key: str) -> str:
        return self.values[key].text()

    # -- readings -----------------------------------------------------------------------------------

    def set_gpu_available(self, available: bool, problem: str | None) -> None:
        self.gpu_mode, self.gpu_problem = available, problem
        if self.remote_host is not None:
            return  # set_remote(None) shows this computer's GPU again
        if available:
            self.hardware.setTitle("GPU")
            self.notice.hide()
            self.second_plot.title = "Power (W), last minute"
        else:
            self.hardware.setTitle("Memory")
            self.notice.setText(NO_GPU_TEXT)
            self.notice.setToolTip(problem or "")
            self.notice.show()
            self.second_plot.title = "Engine RAM (GiB), last minute"
        for key in GPU_ROWS:
            self._set_row_visible(key, available)
        self._set_row_visible("worker_ram", True)
        self.second_plot.apply_theme()

    def set_remote(self, host: str | None) -> None:
        """A server at `host` is the engine (None: the local engine again)."""
        self.remote_host = host
        self.speed_form.setRowVisible(self.values["tps_server"], host is not None)
        self.history.clear()
        if host is None:
            self.set_gpu_available(bool(self.gpu_mode), self.gpu_problem)
            return
        self.hardware.setTitle("GPU (remote)")
        self.notice.setText(remote_text(host))
        self.notice.setToolTip("")
        self.notice.show()
        for key in (*GPU_ROWS, "worker_ram"):
            self._set_row_visible(key, False)
            self.values[key].setText(NA)
        self.second_plot.title = REMOTE_PLOT_TITLE
        self.second_plot.apply_theme()
        self.set_server_rate(None, None)

    def set_server_rate(self, tps: float | None, problem: str | None) -> None:
        """The server's output tokens per second (all its requests), or why there is none."""
        if tps is not None:
            text = f"{tps:.1f} tok/s (all requests)"
        else:
            text = f"{NA} ({problem})" if problem else NA
        self.values["tps_server"].setText(text)

    def show_api_request(self, tps: float, tau: float | None, requests: int) -> None:
        """The local API server's last request (`flashdesk serve` on the loaded engine), in the
        server row: its traffic runs on the same engine as the chat."""
        self.speed_form.setRowVisible(self.values["tps_server"], True)
        tau_text = f", τ {tau:.2f}" if tau is not None else ""
        self.values["tps_server"].setText(f"{tps:.1f} tok/s{tau_text} (last of {requests} API requests)")

    def on_sample(self, sample: Sample) -> None:
        gpu = sample.gpu if self.remote_host is None else None  # a remote engine's GPU is not this one
        if gpu is not None:
            v = self.values
            v["gpu_name"].setText(gpu.name or NA)
            v["vram"].setText(used_of(gpu.vram_used, gpu.vram_total))
            v["worker_vram"].setText(gib(gpu.worker_vram))
            power = num(gpu.power_w, ".0f", " W")
            if gpu.power_limit_w is not None:
                power += f" of {gpu.power_limit_w:.0f} W"
            v["power"].setText(power)
            v["util"].setText(num(gpu.utilization, "d", " %"))
            v["temp"].setText(num(gpu.temperature_c, "d", " °C"))
            if gpu.sm_clock_mhz is None and gpu.mem_clock_mhz is None:
                v["clocks"].setText(NA)
            else:
                v["clocks"].setText(
                    f"SM {num(gpu.sm_clock_mhz, 'd', ' MHz')}, memory {num(gpu.mem_clock_mhz, 'd', ' MHz')}"
                )
        self.values["worker_ram"].setText(gib(sample.worker_rss))
        self.values["system_ram"].setText(used_of(sample.ram_used, sample.ram_total))
        self.history.append((sample.time, *self._plotted(sample)))
        while self.history and self.history[0][0] < sample.time - HISTORY_S:
            self.history.popleft()
        self._plot(sample.time)

    def _plotted(self, sample: Sample) -> tuple[float | None, float | None]:
        """(tok/s, power or engine RAM) to plot; None, a gap, while the engine was not running. A server's
        power is not known here: its plot stays empty."""
        if self.remote_host is not None:
            return self.live_tps or 0.0, None
        if not sample.worker_running:
            return None, None
        gpu = sample.gpu
        second = gpu.power_w if gpu is not None else (sample.worker_rss / GIB if sample.worker_rss else None)
        return self.live_tps or 0.0, second

    def _plot(self, now: float) -> None:
        xs = [t - now for t, *_ in self.history]
        self.tps_plot.set_points(xs, [tps for _, tps, _ in self.history])
        self.second_plot.set_points(xs, [second for _, _, second in self.history])

    def set_live(self, tps: float | None) -> None:
        """The current decode speed (None when nothing is generating)."""
        self.live_tps = tps
        self.values["tps_live"].setText(num(tps, ".1f", " tok/s") if tps is not None else "idle")

    def show_reply(self, stats: dict | None) -> None:
        """The numbers of the reply streaming now, or of the last one."""
        s = stats or {}
        self.values["tps_message"].setText(num(s.get("decode_tokens_per_second"), ".1f", " tok/s"))
        self.values["ttft"].setText(num(s.get("ttft_seconds"), ".2f", " s"))
        prefill = num(s.get("prefill_tokens_per_second"), ".0f", " tok/s")
        if s.get("prompt_tokens"):
            prefill += f" ({s['prompt_tokens']} tokens)"
        self.values["prefill"].setText(prefill)
        joules, per_token = s.get("energy_joules"), s.get("joules_per_token")
        if joules is None:
            self.values["energy"].setText(NA)
        else:
            self.values["energy"].setText(f"{joules:.1f} J, {num(per_token, '.3f', ' J/token')}")
