"""A performance model of the Triton kernels from their compiled code: an estimate, labeled so.

At batch 1 a decode step is a chain of kernels that each stream weights or KV from DRAM. Three
things decide how close a step comes to its floor (bytes / bandwidth), and all three can be read
from a cubin and a launch list without a GPU (docs/performance-model.md gives the reasoning):

- bytes in flight: DRAM answers after ~latency, so a card streams at most (bytes its loads keep
  outstanding) / latency (Little's law). A block keeps its main loop's loads in flight, times
  (num_stages - 1) where they are asynchronous copies the pipeliner runs ahead; occupancy (blocks
  per SM, from registers, shared memory and warps) multiplies that;
- instructions per byte: an SM issues 4 warp-instructions a clock; a loop that converts or
  replicates more than the bytes allow is bound by issue, not by DRAM;
- launches: each kernel pays a gap after the previous one and one DRAM latency to fill and drain;
  with programmatic dependent launch (sm_90 and later), a kernel that follows one that released
  it early is already launched when that one ends, and pays a shorter gap; if it asked L2 for its
  first weights before waiting, their DRAM latency passed during that one's tail, and what is
  left is an L2 hit's. While the kernel before runs a chain on one SM (a fused kernel's tail, a
  one-program norm chain), DRAM idles: what the waiting kernel asked for meanwhile streams from
  L2 after its wait (early_bytes).

A launch is modeled as latency + max(bytes / achieved bandwidth, issue time) + tail + gap, where
the achieved bandwidth is min(efficiency x peak, bytes in flight over its resident blocks / latency).
The constants are public spec-sheet figures and typical microbenchmark values; a lent GPU's
measurements (packaging/gpu_check.py prints them side by side) calibrate them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass

MODEL_LABEL = "modeled (an estimate from compiled code and the launch list, not a measurement)"


@dataclass(frozen=True)
class Card:
    """Published constants of one card: spec sheets (SMs, bandwidth, boost clock), the CUDA
    programming guide's occupancy limits per compute capability, typical measured DRAM latency."""

    name: str
    capability: int
    sms: int
    bandwidth: float  # bytes/s, spec sheet
    clock_hz: float  # boost clock
    registers_per_sm: int = 65536
    shared_per_sm: int = 102400  # bytes a block's shared memory may come from, per SM
    warps_per_sm: int = 48
    blocks_per_sm: int = 16
    latency_s: float = 600e-9  # DRAM load-to-use under load
    l2_latency_s: float = 200e-9  # an L2 hit's load-to-use: the first loads of a kernel that prefetched them
    launch_gap_s: float = 1.0e-6  # between dependent kernels replayed from a CUDA graph
    # the same with programmatic dependent launch (sm_90+): the next kernel's launch overlaps this
    # one; what is left is the wait's release after this one completes (an estimate to calibrate)
    pdl_gap_s: float = 0.5e-6
    efficiency: float = 0.9  # the share of the spec bandwidth a streaming kernel reaches
    l2_bytes: int = 6 * 2**20  # spec sheet
    l2_bandwidth: float = 0.0  # bytes/s an L2 hit streams at (0: twice the DRAM's, a guess to calibrate)

    @property
    def arch(self) -> str:
        return f"sm_{self.capability}"


MB = 2**20
CARDS = {
    "rtx3090": Card(
        "rtx3090", 86, sms=82, bandwidth=936e9, clock_hz=1.695e9, blocks_per_sm=16, latency_s=550e-9, l2_bytes=6 * MB
    ),
    "rtx4090": Card(
        "rtx4090", 89, sms=128, bandwidth=1008e9, clock_hz=2.52e9, blocks_per_sm=24, latency_s=550e-9, l2_bytes=72 * MB
    ),
    "rtx5090": Card(
        "rtx5090", 120, sms=170, bandwidth=1792e9, clock_hz=2.41e9, blocks_per_sm=32, latency_s=600e-9, l2_bytes=96 * MB
    ),
    "h200": Card(
        "h200",
        90,
        sms=132,
        bandwidth=4800e9,
        clock_hz=1.98e9,
        shared_per_sm=233472,
        warps_per_sm=64,
        blocks_per_sm=32,
        latency_s=700e-9,
        l2_bytes=50 * MB,
        # ~5.5 TB/s measured on an H100 PCIe (114 SMs, 1.755 GHz), scaled to 132 SMs at 1.98 GHz
        l2_bandwidth=7.0e12,
    ),
}
ISSUE_PER_CLOCK = 4  # warp-instructions an SM issues per clock (4 schedulers)
REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
RESERVED_SHARED = 1024  # shared memory the driver reserves per block (sm_80 and later)
# Bytes in flight per SM a streaming kernel must keep: Little's law at each card's bandwidth and
# latency is ~25 KB per SM on an H200, ~4 KB on the RTX cards; the floors leave headroom.
MIN_IN_FLIGHT = {90: 32 * 1024}
MIN_IN_FLIGHT_DEFAULT = 8 * 1024

# What each kernel streams: its role in a step's bytes.
ROLES = {
    "_linear_kernel": "weights",
    "_qkv_heads_kernel": "weights",
    "_o_proj_norms_kernel": "weights",
    "_gate_up_kernel": "weights",
    "_down_kernel": "weights",
    "_experts_kernel": "weights",
    "_route_kernel": "weights",
    "_router_kernel": "weights",
    "_decode_split_kernel": "kv",
    "_prefill_kernel": "kv",
}


def card_for(arch: str) -> Card | None:
    cap = int(arch.removeprefix("sm_"))
    return next((card for card in CARDS.values() if card.capability == cap), None)


def role(function: str) -> str:
    return ROLES.get(function, "other")


def min_in_flight(capability: int) -> int:
    return MIN_IN_FLIGHT.get(capability, MIN_IN_FLIGHT_DEFAULT)


def blocks_per_sm(card: Card, registers: int, shared_bytes: int, num_warps: int) -> int:
    """Resident blocks of a kernel on one SM: the least of what registers, shared memory, warps
    and the block limit allow."""
    per_warp = math.ceil(max(registers, 1) * 32 / REGISTER_UNIT) * REGISTER_UNIT
    by_registers = (card.registers_per_sm // per_warp) // num_warps
    by_shared = card.shared_per_sm // (shared_bytes + RESERVED_SHARED)
    by_warps = card.warps_per_sm // num_warps
    return max(0, min(by_registers, by_shared, by_warps, card.blocks_per_sm))


def block_in_flight(loop_load_bytes: int, num_warps: int, num_stages: int, async_copies: bool) -> int:
    """Global-load bytes one block keeps outstanding: one pass of its main loop (per-warp bytes
    times warps), times the passes the pipeliner issues ahead where its loads are async copies."""
    ahead = max(1, num_stages - 1) if async_copies else 1
    return loop_load_bytes * num_warps * ahead


def row_perf(
    arch: str, function: str, constexprs: dict, num_warps: int, num_stages: int, registers: int, shared_bytes: int, loop
) -> dict:
    """The model's per-kernel fields for one compiled row (`loop`: sass.main_loop of its cubin)."""
    card = card_for(arch)
    kind = role(function)
    blocks = blocks_per_sm(card, registers, shared_bytes, num_warps) if card else None
    in_block = block_in_flight(loop.load_bytes, num_warps, num_stages, loop.async_copies)
    row = {
        "role": kind,
        "blocks_per_sm": blocks,
        "bytes_in_flight_per_block": in_block,
        "bytes_in_flight_per_sm": None if blocks is None else in_block * blocks,
        "loop_instructions": loop.instructions,
        "loop_load_bytes": loop.load_bytes * num_warps,
        "async_copies": loop.async_copies,
        "main_loop": loop.is_loop,
        "num_warps": num_warps,
    }
    if function in ("_decode_split_kernel", "_prefill_kernel"):
        row["kv_dtype"] = "fp8" if constexprs.get("FP8") else "bf16"
        row["head_dim"] = constexprs.get("D")
        row["instructions_per_key"] = round(loop.instructions / constexprs["BLOCK_N"], 1)
    return row


def in_flight_floor_ok(row: dict, capability: int) -> bool | None:
    """Whether a weight- or KV-streaming row keeps its arch's floor of bytes in flight per SM
    (None for the others)."""
    if row.get("role") not in ("weights", "kv") or row.get("bytes_in_flight_per_sm") is None:
        return None
    return row["bytes_in_flight_per_sm"] >= min_in_flight(capability)


def tail_seconds(card: Card, launch: dict, tail: dict | None) -> float:
    """A fused kernel's tail: the chain its last program runs after the others, serially (launch
    "tail": the key of the standalone kernel that runs the same code, "tail_passes": how many
    times over). Each pass issues every instruction of that kernel once on one SM (its loops run
    once at batch 1) and waits an L2 hit's latency for what the other programs just wrote."""
    if tail is None:
        return 0.0
    instructions = tail.get("kernel_instructions", tail["loop_instructions"])
    issue = instructions * tail["num_warps"] / (ISSUE_PER_CLOCK * card.clock_hz)
    return launch.get("tail_passes", 1) * (card.l2_latency_s + issue)


def issue_seconds(card: Card, launch: dict, row: dict | None) -> float:
    """The time a launch's busiest SM takes to issue its instructions: its programs' main-loop
    passes (bytes / programs / bytes a pass loads) times the loop's instructions, for each warp."""
    if row is None or not row.get("blocks_per_sm"):
        return 0.0
    programs = max(1, launch["programs"])
    passes = launch["bytes"] / programs / max(1, row["loop_load_bytes"])  # main-loop passes per program
    per_sm = math.ceil(programs / card.sms)
    warp_instructions = per_sm * max(1.0, passes) * row["loop_instructions"] * row["num_warps"]
    return warp_instructions / (ISSUE_PER_CLOCK * card.clock_hz)


def idle_seconds(card: Card, launch: dict, row: dict | None, tail: dict | None) -> float:
    """How long a launch leaves DRAM idle at its end while one SM still works: a fused kernel's
    tail, or the whole of a one-program kernel (a norm chain). The next kernel, released early,
    is resident by then; if it asks L2 for its weights before its wait (launch "prefetch_bytes"),
    DRAM serves them meanwhile (early_bytes)."""
    one_program = launch.get("programs", 1) == 1
    return tail_seconds(card, launch, tail) + (issue_seconds(card, launch, row) if one_program else 0.0)


def early_bytes(card: Card, launch: dict, row: dict | None, early: bool, idle_before: float) -> float:
    """The bytes of a launch already in L2 when its wait ends: what its resident programs asked
    for before the wait (launch "prefetch_bytes", a share for programs not yet resident; where
    only the grid's first "prefetch_programs" ask, the share of those), up to what DRAM delivers
    while the kernel before idles and during the gap, and half of L2."""
    asked = launch.get("prefetch_bytes", 0)
    if not (early and asked and row is not None and row.get("prefetch") and row.get("blocks_per_sm")):
        return 0.0
    programs = max(1, launch.get("prefetch_programs", launch["programs"]))
    resident = min(programs, row["blocks_per_sm"] * (card.sms - 1))  # one SM runs the chain before
    window = idle_before + card.pdl_gap_s
    return min(asked * resident / programs, window * card.efficiency * card.bandwidth, card.l2_bytes / 2)


def launch_seconds(
    card: Card,
    launch: dict,
    row: dict | None,
    released: bool = False,
    tail: dict | None = None,
    idle_before: float = 0.0,
) -> float:
    """One launch: latency + max(bytes / achieved bandwidth, issue time) + tail + gap. `launch` has
    programs and bytes (the bytes it reads and writes); without a compiled row (a torch op, an
    unlisted kernel) it streams at the card's efficiency. released: the kernel before it released
    it early (see pdl); the gap is then card.pdl_gap_s, and if it prefetched its first weights
    before its wait (row "prefetch") their latency is an L2 hit's; the bytes it fetched while the
    kernel before idled (idle_before seconds: early_bytes) stream from L2. tail: the compiled row
    of the chain a fused kernel runs last (tail_seconds)."""
    nbytes = launch["bytes"]
    bandwidth = l2_rate = card.efficiency * card.bandwidth
    if row is not None and row.get("blocks_per_sm"):
        resident = min(max(1, launch["programs"]), row["blocks_per_sm"] * card.sms)
        in_flight = resident * row["bytes_in_flight_per_block"]
        if in_flight:
            bandwidth = min(bandwidth, in_flight / card.latency_s)
            l2_rate = min(card.l2_bandwidth or 2 * card.bandwidth, in_flight / card.l2_latency_s)
    early = released and pdl(launch, row)
    gap = card.pdl_gap_s if early else card.launch_gap_s
    # a kernel launched early that asked L2 for its first weights before its wait finds them there,
    # unless only some of its programs could ask (launch "prefetch_some": the others wait on DRAM)
    prefetched = early and row is not None and row.get("prefetch") and not launch.get("prefetch_some")
    latency = card.l2_latency_s if prefetched else card.latency_s
    warm = min(early_bytes(card, launch, row, early, idle_before), nbytes)
    stream = (nbytes - warm) / bandwidth + warm / l2_rate
    return latency + max(stream, issue_seconds(card, launch, row)) + tail_seconds(card, launch, tail) + gap


def pdl(launch: dict, row: dict | None) -> bool:
    """Whether a launch runs with programmatic dependent launch: launched with its option and
    compiled with its wait (the row of an sm_90+ arch). Such a kernel releases the next at entry."""
    return bool(launch.get("pdl") and row is not None and row.get("pdl"))


def model_step(card: Card, launches: list[dict], rows: dict) -> dict:
    """A step's modeled time from its launch list (each launch: key, programs, bytes, count) and
    the compiled rows of card's arch by launch key."""
    seconds, floor_bytes, count, unmatched, released, idle = 0.0, 0, 0, 0, False, 0.0
    for launch in launches:
        row = rows.get(launch["key"]) if launch.get("key") else None
        tail = rows.get(launch["tail"]) if launch.get("tail") else None
        if (launch.get("key") and row is None) or (launch.get("tail") and tail is None):
            unmatched += launch.get("count", 1)
        seconds += launch.get("count", 1) * launch_seconds(card, launch, row, released, tail, idle)
        released = pdl(launch, row)  # the launch list is in stream order
        idle = idle_seconds(card, launch, row, tail)
        floor_bytes += launch.get("count", 1) * launch["read_bytes"]
        count += launch.get("count", 1)
    floor = floor_bytes / card.bandwidth
    return {
        "card": card.name,
        "launches": count,
        "bytes": floor_bytes,
        "floor_seconds": floor,
        "modeled_seconds": seconds,
        "floor_fraction": floor / seconds if seconds else None,
        "unmatched_launches": unmatched,
    }


# ----------------------------------------------------------------------------- steps

STEP_ENTRY_POINTS = "flashdesk.step_launches"


def record_steps() -> list[dict]:
    """The steps' launch lists, from whatever the `flashdesk.step_launches` entry point names (the
    engine registers its recorder there: kernels/ never imports the engine). Runs in a fresh
    process with Triton's interpreter on (the launches are recorded, not run)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run(
        [sys.executable, "-m", "flashdesk.kernels.perf_model"], env=env, capture_output=True, text=True, timeout=1800
    )
    if run.returncode:
        raise RuntimeError(f"recording the steps' launches failed:\n{run.stderr[-4000:]}")
    return json.loads(run.stdout)


def model_steps(rows: list[dict], steps: list[dict], cards: list[Card]) -> list[dict]:
    """One row per (card, recorded step): card, step, capacity, length, launches, bytes,
    floor_seconds, modeled_seconds, floor_fraction (the rows of each card's arch by launch key)."""
    out = []
    for card in cards:
        by_key = {row["key"]: row for row in rows if row.get("arch") == card.arch and row.get("key")}
        for step in steps:
            modeled = model_step(card, step["launches"], by_key)
            out.append({"step": step["step"], "capacity": step["capacity"], "length": step["length"], **modeled})
    return out


def _main() -> int:
    from importlib.metadata import entry_points

    found = list(entry_points(group=STEP_ENTRY_POINTS))
    if not found:
        print(f"no {STEP_ENTRY_POINTS} entry point is installed (pip install -e .)", file=sys.stderr)
        return 1
    steps = [step for point in found for step in point.load()()]
    json.dump(steps, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
