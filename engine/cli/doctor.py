"""`flashdesk doctor`: what a user runs when something is wrong.

Every probe turns its failure into text: the report itself must never fail, since it is what
people run precisely when their setup is broken. This module never imports Qt.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import platform
import sys
from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:
    from flashdesk.engine.loading.checkpoint import CheckpointReport

Row = tuple[str, str]
REAL_MODEL = "Gemma 4 26B-A4B with DFlash"

GIB = 1024**3


def _err(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"


def _probe(label: str, fn: Callable[[], list[Row] | str]) -> list[Row]:
    """Run one probe; any exception becomes the row's text."""
    try:
        out = fn()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return [(label, f"error ({_err(exc)})")]
    if isinstance(out, str):
        return [(label, out)]
    return out


def _python() -> str:
    return f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"


def _platform() -> str:
    return f"{platform.system()} {platform.release()} {platform.machine()}"


def _import(name: str):
    return importlib.import_module(name)


def _torch_rows() -> list[Row]:
    try:
        torch = _import("torch")
    except Exception as exc:  # noqa: BLE001
        return [
            ("torch", f"not importable ({_err(exc)})"),
            ("CUDA", "unknown (torch is not importable)"),
        ]
    rows: list[Row] = [("torch", str(getattr(torch, "__version__", "unknown version")))]
    rows.extend(_probe("CUDA", lambda: _cuda_rows(torch)))
    return rows


def _cuda_rows(torch) -> list[Row]:
    built = getattr(torch.version, "cuda", None)
    hip = getattr(torch.version, "hip", None)
    if not built and not hip:
        return [("CUDA", "not available (this torch is a CPU-only build)")]
    toolkit = f"CUDA {built}" if built else f"ROCm/HIP {hip}"
    if not torch.cuda.is_available():
        return [("CUDA", f"not available (torch built with {toolkit}, but no usable GPU or driver)")]
    count = torch.cuda.device_count()
    rows: list[Row] = [("CUDA", f"available, torch built with {toolkit}, {count} device(s)")]
    for i in range(count):
        rows.extend(_probe(f"GPU {i}", functools.partial(_gpu_row, torch, i)))
    return rows


def _gpu_row(torch, i: int) -> str:
    name = torch.cuda.get_device_name(i)
    try:
        major, minor = torch.cuda.get_device_capability(i)
        cap = f", sm_{major}{minor}"
    except Exception as exc:  # noqa: BLE001
        cap = f", capability unknown ({_err(exc)})"
    try:
        free, total = torch.cuda.mem_get_info(i)
        mem = f"{_gib(free)} free of {_gib(total)}"
    except Exception as exc:  # noqa: BLE001
        mem = f"memory unknown ({_err(exc)})"
    return f"{name}{cap}, {mem}"


def _nvml_rows() -> list[Row]:
    try:
        pynvml = _import("pynvml")
    except Exception as exc:  # noqa: BLE001
        return [("NVML", f"unavailable: pynvml not importable ({_err(exc)}; pip install nvidia-ml-py)")]
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        return [("NVML", f"unavailable: nvmlInit failed ({_err(exc)}; is the NVIDIA driver installed?)")]
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        if isinstance(driver, bytes):
            driver = driver.decode()
        count = pynvml.nvmlDeviceGetCount()
        rows: list[Row] = [("NVML", f"ok, driver {driver}, {count} device(s)")]
        for i in range(count):
            rows.extend(_probe(f"NVML GPU {i}", functools.partial(_nvml_device, pynvml, i)))
        return rows
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _nvml_device(pynvml, i: int) -> str:
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    name = pynvml.nvmlDeviceGetName(h)
    if isinstance(name, bytes):
        name = name.decode()
    parts = [name]
    try:
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        parts.append(f"{_gib(mem.used)} used of {_gib(mem.total)}")
    except Exception as exc:  # noqa: BLE001
        parts.append(f"memory n/a ({_err(exc)})")
    try:
        power = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        try:
            limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            parts.append(f"{power:.0f} W of {limit:.0f} W")
        except Exception:  # noqa: BLE001
            parts.append(f"{power:.0f} W")
    except Exception as exc:  # noqa: BLE001
        parts.append(f"power n/a ({_err(exc)})")
    return ", ".join(parts)


def _module_version(module: str, dist: str, missing_hint: str) -> str:
    try:
        mod = _import(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return f"not installed{missing_hint}"
        return f"installed but not importable ({_err(exc)})"
    except Exception as exc:  # noqa: BLE001
        return f"installed but not importable ({_err(exc)})"
    version = getattr(mod, "__version__", None)
    if not version:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown version"
    return str(version)


def _kernels() -> str:
    """Which implementation runs the kernels on the default device, as generate --json names it."""
    torch = _import("torch")
    from flashdesk.kernels.backend import describe

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = describe(device)
    if name == "torch" and device.type == "cpu":
        return "torch (the CPU default; FLASHDESK_KERNELS=triton with TRITON_INTERPRET=1 interprets the Triton kernels)"
    return f"{name} on {device.type}"


def _cuda_graphs() -> str:
    """Capture and replay one Triton kernel as a CUDA graph: what each decode step will do."""
    torch = _import("torch")
    from flashdesk.engine.model.cuda_graphs import graphs_wanted

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    wanted, note = graphs_wanted(device)
    if not wanted:
        return note
    from flashdesk.kernels.norm import rms_norm

    x = torch.randn(4, 256, device=device, dtype=torch.bfloat16)
    expected = rms_norm(x, None, 1e-6)  # also compiles the kernel outside the capture
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            y = rms_norm(x, None, 1e-6)
        graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        return f"capture failed ({_err(exc)}): decode and verify steps run eagerly"
    if not torch.equal(y, expected):
        return "a replayed graph gave different numbers: decode and verify steps run eagerly"
    return "on: decode and verify steps are captured once per block length and replayed"


def _kernel_compile() -> str:
    """When the Triton kernels compile (kernels/compile_ahead.py) and where Triton keeps them."""
    torch = _import("torch")
    from flashdesk.kernels.compile_ahead import where_compiled

    return where_compiled(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def _prefix_cache() -> str:
    """The host memory kept conversations may take (engine/decode/prefix_cache.py)."""
    from flashdesk.engine.decode.prefix_cache import default_budget
    from flashdesk.engine.loading.memory_plan import format_bytes

    budget = default_budget()
    if budget <= 0:
        return "off (FLASHDESK_PREFIX_CACHE_MB=0): only the conversation on the device is reused"
    return (
        f"earlier turns and conversations kept in up to {format_bytes(budget)} of host memory "
        "(FLASHDESK_PREFIX_CACHE_MB sets it)"
    )


def environment_report() -> list[Row]:
    """(label, text) rows: Python, platform, torch, CUDA and each GPU, NVML, triton, flash-attn."""
    rows: list[Row] = []
    rows += _probe("Python", _python)
    rows += _probe("Platform", _platform)
    rows += _probe("torch", _torch_rows)
    rows += _probe("NVML", _nvml_rows)
    rows += _probe("triton", lambda: _module_version("triton", "triton", " (GPU kernels fall back to plain torch)"))
    rows += _probe("kernels", _kernels)
    rows += _probe("kernel compile", _kernel_compile)
    rows += _probe("CUDA graphs", _cuda_graphs)
    rows += _probe("prefix cache", _prefix_cache)
    rows += _probe(
        "flash-attn",
        lambda: _module_version("flash_attn", "flash-attn", " (optional: pip install 'flashdesk[flash]', GPU only)"),
    )
    return rows


def format_report(rows: list[Row]) -> str:
    """Rows as aligned `label  text` lines."""
    if not rows:
        return ""
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {text}" for label, text in rows)


class Gpu(NamedTuple):
    """GPU 0, the one the engine runs on."""

    name: str
    free: int
    total: int


def _gpu0() -> Gpu | None:
    """GPU 0 with its free memory, or None where torch sees no GPU."""
    torch = _import("torch")
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return Gpu(torch.cuda.get_device_name(0), free, total)


def machine_verdict(gpu: Gpu | None) -> str:
    """What this machine runs: the real model fits where its memory plan leaves a useful context."""
    from flashdesk.engine.loading.memory_plan import (
        GPU_KV_DTYPE,
        MIN_USEFUL_CONTEXT,
        format_bytes,
        longest_context,
        plan_memory,
    )

    from flashdesk.engine.hub.recommended import real_pair

    cfg, weights, draft = real_pair()
    need = format_bytes(plan_memory(cfg, weights, MIN_USEFUL_CONTEXT, GPU_KV_DTYPE, draft).total)
    if gpu is None:
        return f"CPU only: the demo and test models run; {REAL_MODEL} needs an NVIDIA GPU with at least {need} free"
    card = f"{gpu.name} ({format_bytes(gpu.free)} free of {format_bytes(gpu.total)})"
    longest = longest_context(cfg, weights, GPU_KV_DTYPE, gpu.free, draft)
    if longest >= MIN_USEFUL_CONTEXT:
        return f"{card}: {REAL_MODEL} fits, context up to {longest} tokens with fp8 KV"
    return f"{card}: too little free memory for {REAL_MODEL} (needs at least {need})"


def model_verdict(report: CheckpointReport, gpu: Gpu | None, draft_dir: str | None) -> str:
    """What the checked folder can do here: its first problem, or whether its memory plan fits GPU 0."""
    from flashdesk.engine.loading.memory_plan import GPU_KV_DTYPE, format_bytes, longest_context
    from flashdesk.engine.loading.build import load_draft_model_config

    if not report.ok:
        more = len(report.problems) - 1
        return f"the model is NOT usable: {report.problems[0].splitlines()[0]}" + (
            f" (and {more} more problem{'s' if more > 1 else ''} above)" if more else ""
        )
    plan, config = report.memory, report.config
    assert plan is not None and config is not None  # a report without problems has both
    need = f"{format_bytes(plan.total)} at {plan.context} tokens"
    if gpu is None:
        return f"CPU only: the model is complete and the engine runs it on the CPU here (on a GPU it needs {need})"
    free = f"{format_bytes(gpu.free)} free on {gpu.name}"
    if plan.total <= gpu.free:
        return f"the model is complete and fits: {need}, {free}"
    draft = load_draft_model_config(draft_dir) if draft_dir else None
    longest = longest_context(config, plan.target_bytes, GPU_KV_DTYPE, gpu.free, draft)
    if longest:
        return f"the model is complete but needs {need}, {free}; it fits with --context {longest}"
    return f"the model is complete but does not fit at any context, {free}"


def _verdict_line(decide: Callable[[], str]) -> str:
    """The report's last line; like a probe, it never fails."""
    try:
        return f"verdict: {decide()}"
    except Exception as exc:  # noqa: BLE001 - the report must never fail
        return f"verdict: could not be decided ({_err(exc)})"


def run_doctor(model_dir: str | None, context: int | None = None, draft_dir: str | None = None) -> int:
    """Print the environment report and, given a model folder (and a drafter), the checkpoint check
    and memory plan at `context` tokens; end with one `verdict:` line on what runs here.

    Returns 0, or 1 when the model check found a problem."""
    from flashdesk.engine.loading.checkpoint import inspect_checkpoint

    print(format_report(environment_report()))
    if model_dir is None:
        print(_verdict_line(lambda: machine_verdict(_gpu0())))
        return 0
    print()
    print(f"Model: {model_dir}" + (f"  Drafter: {draft_dir}" if draft_dir else ""))
    try:
        report = inspect_checkpoint(model_dir, context, draft_dir)
    except Exception as exc:  # noqa: BLE001 - doctor reports, it does not crash
        print(f"  problem: {_err(exc)}")
        print(f"verdict: the model could not be checked: {_err(exc)}")
        return 1
    for line in report.lines:
        print(f"  {line}")
    print(_verdict_line(lambda: model_verdict(report, _gpu0(), draft_dir)))
    return 0 if report.ok else 1


def run_kernel_checks(as_json: bool = False) -> int:
    """`flashdesk doctor --kernels`: every kernel family against its torch reference on this
    machine's device, run now (kernels/self_test.py); the results replace what the next load would
    have reused. Returns 0 when all pass, 1 when one fails (it would run on torch)."""
    import json
    from dataclasses import asdict

    torch = _import("torch")
    from flashdesk.kernels import backend, self_test

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not backend.use_triton(device):
        note = (
            "the Triton kernels do not run here, so there is nothing to test (the torch kernels run on the CPU; "
            "FLASHDESK_KERNELS=triton with TRITON_INTERPRET=1 interprets the Triton ones)"
        )
        print(
            json.dumps({"device": str(device), "note": note, "kernels": []})
            if as_json
            else f"kernel self-tests: {note}"
        )
        return 0
    results, pdl = self_test.run_and_keep(device)
    failed = [r.name for r in results if not r.ok]
    if as_json:
        print(
            json.dumps(
                {
                    "device": str(device),
                    "kernels_backend": backend.describe(device),
                    "pdl": pdl,
                    "kernels": [asdict(r) for r in results],
                    "failed": failed,
                }
            )
        )
    else:
        print(
            f"Kernel self-tests on {backend.describe(device)} ({device}): each family against its torch "
            "reference; error relative to the reference's largest value"
        )
        for r in results:
            invariant = {True: "batch invariant", False: "NOT batch invariant", None: ""}[r.batch_invariant]
            measure = "-" if r.max_error is None else f"{r.max_error:.2e} (tolerance {r.tolerance:g})"
            print(f"  {'ok  ' if r.ok else 'FAIL'} {r.name:<20} {measure:<28} {invariant:<20} {r.seconds:.1f} s")
            if not r.ok:
                print(f"       {self_test.why(r)}")
        if not pdl:
            print(f"  programmatic dependent launch: off ({self_test.PDL_OFF})")
        print(
            f"verdict: {len(results) - len(failed)} of {len(results)} kernel families pass"
            + (f"; {', '.join(failed)} will run on the slower torch path" if failed else "")
        )
    return 1 if failed else 0
