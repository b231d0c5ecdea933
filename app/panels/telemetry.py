"""GPU and memory readings, sampled on a background thread about twice a second (Settings changes
the interval: INTERVAL_RANGE_MS).

Why a thread: NVML calls can block for milliseconds (or much longer on a struggling driver) and
the window must not stutter. Why field by field: drivers, cards and containers differ in what
they report (consumer cards lack some clocks, containers hide other processes, older drivers have
no energy counter), so every reading is taken on its own and a failure leaves just that field
None ("n/a" on screen). Without NVML or an NVIDIA GPU, `Sample.gpu` is None and `nvml_problem`
says why; the worker's RAM is always read (psutil). Each sample also says whether the engine's
process was running, so the plots leave a gap for the time it was not instead of a line across it.

The NVML module is passed in (`nvml=`) so tests can hand in a fake; by default it is pynvml from
nvidia-ml-py.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from PySide6.QtCore import QObject, Qt, Signal

INTERVAL_S = 0.5
INTERVAL_RANGE_MS = (250, 5000)  # what Settings offers: a quick look at a spike, or a quiet machine


@dataclass(frozen=True)
class GpuReading:
    name: str | None = None
    vram_used: int | None = None  # bytes, whole device
    vram_total: int | None = None
    worker_vram: int | None = None  # bytes the worker process holds on this device
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization: int | None = None  # percent
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    energy_mj: int | None = None  # the card's energy counter (millijoules since the driver loaded)


@dataclass(frozen=True)
class Sample:
    time: float  # time.monotonic()
    gpu: GpuReading | None  # None without NVML or an NVIDIA GPU
    worker_rss: int | None  # bytes
    ram_used: int | None
    ram_total: int | None
    worker_running: bool = True  # the engine's process was up


class Nvml:
    """One NVIDIA device through NVML. `available` is False (and `problem` says why) without one."""

    def __init__(self, nvml=None):
        self.nvml = nvml
        self.available = False
        self.problem: str | None = None
        self.handle = None
        self.lock = threading.Lock()
        try:
            if self.nvml is None:
                import pynvml

                self.nvml = pynvml
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
            if count < 1:
                self.problem = "NVML sees no NVIDIA GPU"
                return
            self.handle = self.nvml.nvmlDeviceGetHandleByIndex(0)
            self.available = True
        except Exception as exc:  # noqa: BLE001 - no NVML is a state to show, not an error
            self.problem = f"NVML is not available ({_err(exc)})"

    def bind(self, uuid: str | None) -> None:
        """Read the device the worker runs on (by its NVML UUID); device 0 when unknown."""
        if not self.available or not uuid:
            return
        with self.lock:
            try:
                self.handle = self.nvml.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:  # noqa: BLE001 - keep the previous device
                pass

    def _get(self, fn, *args):
        try:
            return fn(self.handle, *args)
        except Exception:  # noqa: BLE001 - this field is n/a on this driver/card
            return None

    def read(self, worker_pid: int | None) -> GpuReading:
        n = self.nvml
        with self.lock:
            name = self._get(n.nvmlDeviceGetName)
            mem = self._get(n.nvmlDeviceGetMemoryInfo)
            power = self._get(n.nvmlDeviceGetPowerUsage)
            limit = self._get(n.nvmlDeviceGetEnforcedPowerLimit)
            util = self._get(n.nvmlDeviceGetUtilizationRates)
            temp = self._get(n.nvmlDeviceGetTemperature, getattr(n, "NVML_TEMPERATURE_GPU", 0))
            sm = self._get(n.nvmlDeviceGetClockInfo, getattr(n, "NVML_CLOCK_SM", 1))
            memclk = self._get(n.nvmlDeviceGetClockInfo, getattr(n, "NVML_CLOCK_MEM", 2))
            energy = self._get(n.nvmlDeviceGetTotalEnergyConsumption)
            worker = self._worker_vram(worker_pid)
        return GpuReading(
            name=name.decode() if isinstance(name, bytes) else name,
            vram_used=_int(getattr(mem, "used", None)),
            vram_total=_int(getattr(mem, "total", None)),
            worker_vram=worker,
            power_w=power / 1000 if isinstance(power, (int, float)) else None,
            power_limit_w=limit / 1000 if isinstance(limit, (int, float)) else None,
            utilization=_int(getattr(util, "gpu", None)),
            temperature_c=_int(temp),
            sm_clock_mhz=_int(sm),
            mem_clock_mhz=_int(memclk),
            energy_mj=_int(energy),
        )

    def _worker_vram(self, pid: int | None) -> int | None:
        if pid is None:
            return None
        procs = self._get(self.nvml.nvmlDeviceGetComputeRunningProcesses)
        if procs is None:
            return None
        for proc in procs:
            if getattr(proc, "pid", None) == pid:
                return _int(getattr(proc, "usedGpuMemory", None))
        return 0  # NVML answered, and the worker holds nothing on this device

    def energy_mj(self) -> int | None:
        if not self.available:
            return None
        with self.lock:
            return _int(self._get(self.nvml.nvmlDeviceGetTotalEnergyConsumption))

    def close(self) -> None:
        if self.available:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.available = False


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _err(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def worker_alive(pid: int | None) -> bool:
    """The engine's process is running (not gone, not a zombie awaiting its parent)."""
    if not pid:
        return False
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - gone, or psutil missing: no worker to show
        return False


def read_memory(pid: int | None) -> tuple[int | None, int | None, int | None]:
    """(worker RSS, RAM used, RAM total) in bytes, each None when unreadable."""
    try:
        import psutil
    except ImportError:
        return None, None, None
    rss = None
    if pid:
        try:
            rss = int(psutil.Process(pid).memory_info().rss)
        except Exception:  # noqa: BLE001 - the worker may just have exited
            rss = None
    try:
        vm = psutil.virtual_memory()
        return rss, int(vm.total - vm.available), int(vm.total)
    except Exception:  # noqa: BLE001
        return rss, None, None


class TelemetrySampler(QObject):
    """Samples on its own thread; `sampled` is delivered on the GUI thread (queued)."""

    sampled = Signal(object)  # Sample
    _deliver = Signal(object)

    def __init__(self, nvml=None, interval: float = INTERVAL_S, parent: QObject | None = None):
        super().__init__(parent)
        self.nvml = Nvml(nvml)
        self.interval = interval
        self.worker_pid: int | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # ends the wait for the next sample early: stop, a new interval
        self._thread: threading.Thread | None = None
        self._deliver.connect(self.sampled, Qt.ConnectionType.QueuedConnection)

    @property
    def gpu_available(self) -> bool:
        return self.nvml.available

    @property
    def problem(self) -> str | None:
        return self.nvml.problem

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._wake.clear()
            self._thread = threading.Thread(target=self._run, name="flashdesk-telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        self.nvml.close()

    def set_interval(self, seconds: float) -> None:
        """Sample every `seconds` from now on: a long wait under the old interval ends at once."""
        self.interval = seconds
        self._wake.set()

    def sample(self) -> Sample:
        pid = self.worker_pid
        gpu = self.nvml.read(pid) if self.nvml.available else None
        rss, used, total = read_memory(pid)
        return Sample(time.monotonic(), gpu, rss, used, total, worker_alive(pid))

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._deliver.emit(self.sample())
            except RuntimeError:  # the QObject is gone (app closing)
                return
            self._wake.wait(max(0.05, self.interval - (time.monotonic() - started)))
            self._wake.clear()
