"""Where a step's device time goes: the kernels it launches, each kernel's share, and how long the
device sat idle between them.

At batch 1 a step costs its bytes plus a gap and a tail per kernel (docs/performance-model.md; some 600
dependent kernels a step is the main loss of today's engines). The byte floor says how far a step
is from the card's bandwidth; this says why: a step whose kernels are busy 95% of its span is
bound by the kernels themselves, one busy 60% by the gaps between them (fewer, fused kernels).
Read from torch.profiler's CUDA activity over one run of the step, CUDA graph replays included.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import torch

TOP_KERNELS = 8


def summarize(kernels: Iterable[tuple[str, float, float]], top: int = TOP_KERNELS) -> dict:
    """(name, start_us, end_us) of each kernel a step ran -> the count, the span from the first
    start to the last end, the time some kernel ran (overlaps counted once), the idle share of the
    span, and the `top` kernels by time with their calls and share of the busy time."""
    runs = sorted((start, end, name) for name, start, end in kernels)
    if not runs:
        return {"kernels": 0, "span_seconds": 0.0, "busy_seconds": 0.0, "idle_fraction": None, "top": []}
    busy, covered_to = 0.0, runs[0][0]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for start, end, name in runs:
        busy += max(0.0, end - max(start, covered_to))
        covered_to = max(covered_to, end)
        by_name[name][0] += 1
        by_name[name][1] += end - start
    span = covered_to - runs[0][0]
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    total = sum(us for _, us in by_name.values())
    return {
        "kernels": len(runs),
        "span_seconds": span / 1e6,
        "busy_seconds": busy / 1e6,
        "idle_fraction": 1 - busy / span if span > 0 else None,
        "top": [
            {"name": name, "calls": calls, "seconds": us / 1e6, "share": us / total if total else None}
            for name, (calls, us) in ranked
        ],
    }


def profile_step(device: torch.device, fn) -> dict | None:
    """summarize() of one run of fn() on a CUDA device (None elsewhere: the CPU's ops are not
    kernels). A profiler that fails says why in `error` instead of failing the bench."""
    if device.type != "cuda":
        return None
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize(device)
        kernels = [
            (event.name, event.time_range.start, event.time_range.end)
            for event in prof.events()
            if event.device_type == DeviceType.CUDA
        ]
    except Exception as exc:  # noqa: BLE001 - a diagnostic: say why, keep the timings
        return {"error": f"{type(exc).__name__}: {exc}"}
    return summarize(kernels)


def describe(profile: dict) -> str:
    """One line for the bench table."""
    if "error" in profile:
        return f"kernel profile failed: {profile['error']}"
    if not profile["kernels"]:
        return "no kernels recorded"
    top = ", ".join(f"{row['name'][:40]} x{row['calls']} {100 * row['share']:.0f}%" for row in profile["top"][:3])
    return (
        f"{profile['kernels']} kernels, busy {1000 * profile['busy_seconds']:.3f} of "
        f"{1000 * profile['span_seconds']:.3f} ms (idle {100 * (profile['idle_fraction'] or 0):.0f}%); {top}"
    )
