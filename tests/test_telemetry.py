"""GPU telemetry: NVML absent, NVML failing on single fields, NVML with fixed readings; and the panel."""

from __future__ import annotations

import os
import time
import types

import pytest
from PySide6.QtTest import QTest

from flashdesk.app.panels.telemetry import Nvml, Sample, TelemetrySampler

GIB = 1024**3


class NVMLError(Exception):
    pass


def until(condition, timeout_ms: int = 5000) -> None:
    """Wait for `condition`, processing Qt events. QTest.qWait processes events itself, so this keeps
    working after an earlier test ran and quit QApplication.exec() (every later QEventLoop.exec, which
    qtbot.wait and qtbot.waitUntil use, then returns at once)."""
    end = time.monotonic() + timeout_ms / 1000
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout_ms} ms waiting for {condition}")
        QTest.qWait(10)


def fake_nvml(
    fail: tuple[str, ...] = (), pid: int = 4242, init_error: Exception | None = None, devices: int = 1
) -> types.SimpleNamespace:
    """A stand-in for pynvml with fixed readings; the functions named in `fail` raise NVMLError."""

    def reading(name, value):
        def fn(*_args):
            if name in fail:
                raise NVMLError(f"{name}: Not Supported")
            return value() if callable(value) else value

        return fn

    def init():
        if init_error:
            raise init_error

    clocks = {1: 2520, 2: 10501}
    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: devices,
        nvmlDeviceGetHandleByIndex=lambda i: f"handle{i}",
        nvmlDeviceGetHandleByUUID=lambda uuid: "handle-by-uuid",
        nvmlDeviceGetName=reading("name", "NVIDIA GeForce RTX 4090"),
        nvmlDeviceGetMemoryInfo=reading("memory", types.SimpleNamespace(used=20 * GIB, total=24 * GIB, free=4 * GIB)),
        nvmlDeviceGetPowerUsage=reading("power", 287_500),
        nvmlDeviceGetEnforcedPowerLimit=reading("limit", 450_000),
        nvmlDeviceGetUtilizationRates=reading("util", types.SimpleNamespace(gpu=97, memory=60)),
        nvmlDeviceGetTemperature=reading("temp", 66),
        nvmlDeviceGetClockInfo=lambda handle, kind: reading("clocks", clocks[kind])(),
        nvmlDeviceGetTotalEnergyConsumption=reading("energy", 123_456_789),
        nvmlDeviceGetComputeRunningProcesses=reading(
            "procs",
            [types.SimpleNamespace(pid=1, usedGpuMemory=GIB), types.SimpleNamespace(pid=pid, usedGpuMemory=18 * GIB)],
        ),
    )


def test_fixed_readings() -> None:
    nvml = Nvml(fake_nvml())
    assert nvml.available and nvml.problem is None
    r = nvml.read(4242)
    assert r.name == "NVIDIA GeForce RTX 4090"
    assert (r.vram_used, r.vram_total, r.worker_vram) == (20 * GIB, 24 * GIB, 18 * GIB)
    assert (r.power_w, r.power_limit_w, r.utilization, r.temperature_c) == (287.5, 450.0, 97, 66)
    assert (r.sm_clock_mhz, r.mem_clock_mhz, r.energy_mj) == (2520, 10501, 123_456_789)
    assert nvml.read(999).worker_vram == 0  # NVML answered; that process holds nothing here
    assert nvml.energy_mj() == 123_456_789
    nvml.bind("GPU-1234")
    assert nvml.handle == "handle-by-uuid"


def test_each_field_fails_on_its_own() -> None:
    nvml = Nvml(fake_nvml(fail=("power", "clocks", "energy", "procs")))
    r = nvml.read(4242)
    assert r.power_w is None and r.sm_clock_mhz is None and r.mem_clock_mhz is None
    assert r.energy_mj is None and r.worker_vram is None and nvml.energy_mj() is None
    assert r.power_limit_w == 450.0 and r.vram_used == 20 * GIB and r.temperature_c == 66


@pytest.mark.parametrize(
    "nvml, why",
    [
        (fake_nvml(init_error=NVMLError("NVML Shared Library Not Found")), "Shared Library Not Found"),
        (fake_nvml(devices=0), "no NVIDIA GPU"),
    ],
)
def test_without_nvml(nvml, why: str) -> None:
    n = Nvml(nvml)
    assert not n.available and why in n.problem
    assert n.energy_mj() is None


def test_without_pynvml_module(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    n = Nvml()
    assert not n.available and "NVML is not available" in n.problem


def test_sampler_thread_delivers_on_the_gui_thread(qtbot) -> None:
    from PySide6.QtCore import QThread

    sampler = TelemetrySampler(fake_nvml(), interval=0.05)
    sampler.worker_pid = os.getpid()
    threads, samples = [], []
    sampler.sampled.connect(lambda s: (threads.append(QThread.currentThread()), samples.append(s)))
    sampler.start()
    until(lambda: samples)
    sampler.stop()
    sample = samples[0]
    assert isinstance(sample, Sample) and sample.gpu.power_w == 287.5
    assert sample.worker_rss and sample.worker_rss > 0  # psutil read this process
    assert threads and all(t is QThread.currentThread() for t in threads)


# -- the panel ------------------------------------------------------------------------------------------


@pytest.fixture
def panel(qtbot):
    from flashdesk.app.panels.telemetry_panel import TelemetryPanel

    widget = TelemetryPanel()
    qtbot.addWidget(widget)
    widget.show()
    return widget


def _sample(nvml: Nvml) -> Sample:
    return Sample(
        time=100.0,
        gpu=nvml.read(4242) if nvml.available else None,
        worker_rss=3 * GIB,
        ram_used=10 * GIB,
        ram_total=64 * GIB,
    )


def test_panel_shows_fixed_readings(panel) -> None:
    nvml = Nvml(fake_nvml())
    panel.set_gpu_available(True, None)
    panel.set_live(42.0)
    panel.on_sample(_sample(nvml))
    assert panel.text("gpu_name") == "NVIDIA GeForce RTX 4090"
    assert panel.text("vram") == "20.00 GiB of 24.00 GiB"
    assert panel.text("worker_vram") == "18.00 GiB"
    assert panel.text("power") == "288 W of 450 W"
    assert panel.text("util") == "97 %"
    assert panel.text("temp") == "66 °C"
    assert panel.text("clocks") == "SM 2520 MHz, memory 10501 MHz"
    assert panel.text("tps_live") == "42.0 tok/s"
    assert not panel.notice.isVisible()
    panel.show_reply(
        {
            "decode_tokens_per_second": 88.25,
            "ttft_seconds": 0.31,
            "prefill_tokens_per_second": 1500,
            "prompt_tokens": 300,
            "energy_joules": 51.2,
            "joules_per_token": 0.256,
        }
    )
    assert panel.text("tps_message") == "88.2 tok/s" and panel.text("ttft") == "0.31 s"
    assert panel.text("prefill") == "1500 tok/s (300 tokens)"
    assert panel.text("energy") == "51.2 J, 0.256 J/token"


def test_panel_single_fields_na(panel) -> None:
    nvml = Nvml(fake_nvml(fail=("power", "clocks", "temp", "procs", "name")))
    panel.set_gpu_available(True, None)
    panel.on_sample(_sample(nvml))
    assert panel.text("power") == "n/a of 450 W"
    assert panel.text("clocks") == "n/a" and panel.text("temp") == "n/a"
    assert panel.text("worker_vram") == "n/a" and panel.text("gpu_name") == "n/a"
    assert panel.text("vram") == "20.00 GiB of 24.00 GiB" and panel.text("util") == "97 %"
    panel.show_reply({"tokens": 10})
    assert panel.text("energy") == "n/a" and panel.text("ttft") == "n/a"


def test_panel_without_nvidia_gpu(panel) -> None:
    nvml = Nvml(fake_nvml(init_error=NVMLError("Driver Not Loaded")))
    panel.set_gpu_available(nvml.available, nvml.problem)
    panel.on_sample(_sample(nvml))
    assert panel.notice.isVisible() and "No NVIDIA GPU" in panel.notice.text()
    assert "Driver Not Loaded" in panel.notice.toolTip()
    assert panel.text("worker_ram") == "3.00 GiB"
    assert panel.text("system_ram") == "10.00 GiB of 64.00 GiB"
    assert not panel.values["power"].isVisible() and not panel.values["vram"].isVisible()
    assert panel.values["worker_ram"].isVisible()
    assert "RAM" in panel.second_plot.title
