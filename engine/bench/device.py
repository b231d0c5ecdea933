"""The device a bench runs on: its name and driver (they key the kept results) and, on a GPU,
NVML's energy counter (joules per token)."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name") and ":" in line:
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


class DeviceProbe:
    """The device's name and driver (the results key) and NVML's energy counter on a GPU."""

    def __init__(self, device: torch.device):
        self.nvml = self.handle = None
        self.energy_note = "n/a on the CPU"
        if device.type != "cuda":
            self.name, self.driver = cpu_name(), "cpu"
            return
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.name, self.driver = torch.cuda.get_device_name(index), "driver unknown"
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - no NVML: no energy, the rest still runs
            self.energy_note = f"n/a (NVML unavailable: {exc})"
            return
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            self.driver = driver.decode() if isinstance(driver, bytes) else str(driver)
            self.handle = self._handle(pynvml, index)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.energy_note = "NVML energy counter"
        except Exception as exc:  # noqa: BLE001 - e.g. a GPU older than Volta has no energy counter
            self.handle = None
            self.energy_note = f"n/a (NVML energy counter: {exc})"

    @staticmethod
    def _handle(pynvml, index: int):
        """NVML's handle of torch's device `index`: by PCI bus id (CUDA_VISIBLE_DEVICES may renumber)."""
        try:
            p = torch.cuda.get_device_properties(index)
            # torch's stub of the properties type lacks the PCI fields its CUDA builds have
            bus_id = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"  # type: ignore[attr-defined]
            return pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except Exception:  # noqa: BLE001 - an older torch without the PCI fields
            return pynvml.nvmlDeviceGetHandleByIndex(index)

    def energy_mj(self) -> float | None:
        """The GPU's energy counter in millijoules (since the driver loaded), or None."""
        if self.handle is None or self.nvml is None:
            return None
        try:
            return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:  # noqa: BLE001
            return None

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.nvml = self.handle = None
