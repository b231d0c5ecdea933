"""`flashdesk bench --synthetic`: full-size step timings against the bytes each step must read.

The model is engine/bench/synthetic_model.py's: the exact Gemma 4 26B-A4B and DFlash drafter
shapes with random weights made on the device. Each step's bytes are counted by
engine/bench/step_bytes.py; on a GPU the card's copy bandwidth turns them into floor_seconds =
bytes / bandwidth and the fraction of that floor each step reaches.

Steps timed (engine/bench/step_bytes.py counts their bytes):
- prefill-1024, prefill-8192: a forward of that many tokens from an empty cache of its own (the
  names stay when `--prefill-lengths` shrinks them for a CPU run; on the CPU one longer than
  --context is skipped with a note, on a GPU both always run);
- ar: one token at --context tokens of context;
- verify-1 .. verify-16: m tokens at --context, logits of every row;
- draft, draft-int4: the drafter's block of 15 after its context holds --context positions, with
  the checkpoint's bf16 weights and with `--draft-quantize int4`'s.

The AR, verify and draft steps are the engine's: on a GPU each is replayed from its CUDA graph
(engine/model/cuda_graphs.py), as a generation replays it, with the drafter's features computed and
nothing committed; timed eagerly, a step would measure Python launching some 400 kernels. Where
capture fails the steps run eagerly and the report says so (`cuda_graphs`). The experts a step
reads are counted from the routing of its timed runs, or where a replay is timed (no Python runs in
it), from one eager run of the same tokens before.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from flashdesk.engine.bench.kernel_profile import describe as describe_profile, profile_step
from flashdesk.engine.bench.step_bytes import Bytes, RouterRecorder, draft_step_bytes, target_step_bytes
from flashdesk.engine.bench.synthetic_model import synthetic_drafter, synthetic_pair
from flashdesk.engine.model.known_models import REAL_LAYERS
from flashdesk.engine.model.cuda_graphs import StepGraphs, draft_logits, graphs_wanted

DRAFT_K = 15
VERIFY_LENGTHS = tuple(range(1, 17))
PREFILL_NAMES = ("prefill-1024", "prefill-8192")
GPU_CONTEXT, CPU_CONTEXT = 4096, 256
FILL_CHUNK = 1024
COPY_BYTES = 1 << 30
TARGETS = {"ar_floor_fraction": 0.70, "verify16_over_ar": 2.0, "draft_over_ar": 0.35}
PROFILED = ("ar", "verify-16", "draft", "draft-int4")  # with --profile on a GPU: where their device time goes


# --- timing ---------------------------------------------------------------------------------------


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(device, fn, warmup: int, repeats: int, before=None, after=None) -> float:
    """Median seconds of fn(); before/after (cache set-up, rollback) run outside the timed region."""
    samples = []
    for i in range(warmup + repeats):
        if before:
            before()
        _sync(device)
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1000
        else:
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
        if after:
            after()
        if i >= warmup:
            samples.append(seconds)
    return statistics.median(samples)


def copy_bandwidth(device, nbytes: int = COPY_BYTES, repeats: int = 5) -> float | None:
    """Bytes per second of a device-to-device copy (read + written), or None off the GPU."""
    if device.type != "cuda":
        return None
    buffers = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(2)]
    seconds = time_step(device, lambda: buffers[1].copy_(buffers[0]), warmup=2, repeats=repeats)
    buffers.clear()
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


# --- the run --------------------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    seconds: float | None
    bytes: Bytes | None
    tokens: int = 0
    note: str | None = None
    profile: dict | None = None  # kernel_profile.profile_step of one run (--profile on a GPU)

    def floor(self, bandwidth: float | None) -> float | None:
        return self.bytes.total / bandwidth if bandwidth and self.bytes else None

    def as_dict(self, bandwidth: float | None) -> dict:
        floor = self.floor(bandwidth)
        row = {
            "name": self.name,
            "seconds": self.seconds,
            "bytes": self.bytes.total if self.bytes else None,
            "floor_seconds": floor,
            "tokens": self.tokens,
            "floor_fraction": floor / self.seconds if floor and self.seconds else None,
            "bytes_by_kind": self.bytes.as_dict() if self.bytes else None,
            "experts_per_layer": self.bytes.experts_per_layer if self.bytes else None,
        }
        if self.note:
            row["note"] = self.note
        if self.profile is not None:
            row["kernel_profile"] = self.profile
        return row


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return device


def _dtype(name: str, device) -> torch.dtype:
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32  # bf16 matmuls crawl on CPUs
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def _kv_dtype(name: str, device, dtype) -> str:
    if name in (None, "auto"):
        return "fp8" if device.type == "cuda" else ("float32" if dtype == torch.float32 else "bfloat16")
    return name


def parse_prefill_lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--prefill-lengths must be two comma-separated integers, got {text!r}") from None
    if len(lengths) != len(PREFILL_NAMES) or min(lengths) < 1:
        raise ValueError(
            f"--prefill-lengths needs {len(PREFILL_NAMES)} positive lengths "
            f"(for {', '.join(PREFILL_NAMES)}), got {text!r}"
        )
    return lengths


def run_synthetic(
    layers: int = REAL_LAYERS,
    context: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    kv_dtype: str = "auto",
    prefill_lengths=(1024, 8192),
    repeats: int | None = None,
    seed: int = 0,
    log=None,
    profile: bool = False,
    capacity: int | None = None,
) -> dict:
    """Build the synthetic model on the device, time every step, and return the report dict; with
    `profile`, on a GPU, each PROFILED step's kernels too (kernel_profile.py). `capacity`: the
    cache's and the drafter context's size (default: the context fill and one block), as a long
    context limit allocates them: attention grids follow it."""
    from flashdesk.engine.decode.kernel_warmup import compile_generation_kernels
    from flashdesk.kernels.backend import describe

    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    dev = _device(device)
    torch_dtype = _dtype(dtype, dev)
    kv = _kv_dtype(kv_dtype, dev, torch_dtype)
    gpu = dev.type == "cuda"
    context = context if context is not None else (GPU_CONTEXT if gpu else CPU_CONTEXT)
    if context < 1:
        raise ValueError(f"--context must be at least 1, got {context}")
    capacity = max(capacity or 0, context + VERIFY_LENGTHS[-1])
    repeats = repeats if repeats is not None else (5 if gpu else 1)
    warmup = 1 if gpu else 0
    prefill_repeats = max(1, min(repeats, 3))
    bandwidth = copy_bandwidth(dev)
    t0 = time.perf_counter()
    model, drafter = synthetic_pair(layers, dev, torch_dtype, seed)
    cfg, dcfg = model.cfg, drafter.cfg
    taps = tuple(dcfg.target_layer_ids)
    _sync(dev)
    log(
        f"synthetic Gemma 4 26B-A4B, {layers} layer(s), {torch_dtype} on {dev}, KV {kv}: "
        f"built in {time.perf_counter() - t0:.1f} s"
    )
    gen = torch.Generator(device=dev).manual_seed(seed + 7)

    def tokens(n):
        return torch.randint(5, cfg.vocab_size, (n,), device=dev, generator=gen)

    # the context's cache and drafter context, allocated first: the kernels compile ahead over them
    cache = model.new_cache(capacity, kv)
    dctx = drafter.new_context(capacity)
    took = compile_generation_kernels(model, cache, drafter, dctx)
    compiled = None if took is None else f"kernels compiled ahead in {took:.1f} s on {os.cpu_count()} cores"
    if compiled:
        log(compiled)
    graphs_on, graphs_note = graphs_wanted(dev)
    graphs = StepGraphs(model, cache, taps, drafter, dctx) if graphs_on else None
    recorder = RouterRecorder(model)
    steps: list[Step] = []
    with recorder.active():
        # prefill from an empty cache
        for name, length in zip(PREFILL_NAMES, prefill_lengths):
            if length > context and not gpu:  # a small CPU run; a GPU prefills from its own cache regardless
                steps.append(Step(name, None, None, length, f"skipped: {length} tokens exceed --context {context}"))
                log(f"{name}: skipped ({length} > context {context})")
                continue
            ids = tokens(length)
            holder = {}

            def fresh(length=length):
                holder["cache"] = model.new_cache(length, kv)
                recorder.reset()

            seconds = time_step(
                dev,
                lambda ids=ids: model.forward(ids, holder["cache"], logits_rows="last"),
                warmup,
                prefill_repeats,
                before=fresh,
            )
            holder.clear()
            steps.append(
                Step(name, seconds, target_step_bytes(model, kv, 0, length, _unique(ids), recorder.union()), length)
            )
            log(f"{name}: {1000 * seconds:.1f} ms")

        # the context, once: target cache and drafter context side by side
        tap_chunks = []
        t0 = time.perf_counter()
        chunk = FILL_CHUNK if gpu else max(context, 1)
        for begin in range(0, context, chunk):
            out = model.forward(tokens(min(chunk, context - begin)), cache, taps=taps, logits_rows="last")
            drafter.add_context(dctx, out.taps)
            tap_chunks.append(out.taps)
        _sync(dev)
        log(f"context of {context} tokens filled in {time.perf_counter() - t0:.1f} s")

        def target_step(name, m):
            ids = tokens(m)
            replay = graphs if graphs is not None and graphs.covers(m) else None
            recorder.reset()
            if replay is not None:  # a replay runs no Python: the experts these tokens route to, from an eager run
                model.compute(ids, cache, taps, "all")

            def forward():  # the engine's step: writes K/V past the context, commits nothing
                return replay.run(ids) if replay is not None else model.compute(ids, cache, taps, "all")

            seconds = time_step(dev, forward, warmup, repeats)  # eager runs are recorded as they are timed
            read = target_step_bytes(model, kv, context, m, _unique(ids), recorder.union())
            log(f"{name}: {1000 * seconds:.1f} ms")
            return Step(
                name, seconds, read, m, profile=profile_step(dev, forward) if profile and name in PROFILED else None
            )

        steps.append(target_step("ar", 1))
        for m in VERIFY_LENGTHS:
            steps.append(target_step(f"verify-{m}", m))

    anchor = tokens(1)

    def draft_step(name, d, ctx, graphs):
        def draft():
            return draft_logits(graphs, d, ctx, anchor, DRAFT_K)

        seconds = time_step(dev, draft, warmup, repeats)
        log(f"{name}: {1000 * seconds:.1f} ms")
        return Step(
            name,
            seconds,
            draft_step_bytes(d, context),
            DRAFT_K + 1,
            profile=profile_step(dev, draft) if profile and name in PROFILED else None,
        )

    steps.append(draft_step("draft", drafter, dctx, graphs))
    notes = [compiled] if compiled else []
    capture_errors = [graphs.error] if graphs is not None and graphs.error else []
    del dctx
    drafter = graphs = None  # the bf16 drafter's memory (and its graphs') goes before the int4 one is made
    drafter = synthetic_drafter(model, seed + 1, quantize="int4")
    ctx4 = drafter.new_context(capacity)
    for taps_chunk in tap_chunks:
        drafter.add_context(ctx4, taps_chunk)
    graphs = StepGraphs(model, cache, taps, drafter, ctx4) if graphs_on else None
    steps.append(draft_step("draft-int4", drafter, ctx4, graphs))
    if graphs is not None and graphs.error:
        capture_errors.append(graphs.error)
    if capture_errors:  # as `generate --json` words it
        graphs_note = f"capture failed, steps run eagerly ({capture_errors[0]})"
    if cfg.enable_moe and any(
        step.bytes and step.bytes.experts_per_layer is None and step.name.startswith(("prefill", "ar", "verify"))
        for step in steps
    ):
        notes.append("the MoE call was not observed: expert bytes of some steps are missing")

    report = _report(dev, layers, context, kv, torch_dtype, bandwidth, steps, notes, describe(dev), graphs_note)
    return dict(report, capacity=capacity)


def _unique(ids: torch.Tensor) -> int:
    return int(torch.unique(ids).numel())


def _report(dev, layers, context, kv, dtype, bandwidth, steps, notes, kernels, cuda_graphs) -> dict:
    by_name = {step.name: step for step in steps}

    def ratio(a, b):
        sa, sb = by_name.get(a), by_name.get(b)
        return sa.seconds / sb.seconds if sa and sb and sa.seconds and sb.seconds else None

    ar = by_name["ar"]
    ar_floor = ar.floor(bandwidth)
    ratios = {
        "verify16_over_ar": ratio("verify-16", "ar"),
        "draft_over_ar": ratio("draft", "ar"),
        "ar_floor_fraction": ar_floor / ar.seconds if ar_floor and ar.seconds else None,
    }
    if "draft-int4" in by_name:
        ratios["draft_int4_over_ar"] = ratio("draft-int4", "ar")
    targets = None
    if dev.type == "cuda":
        targets = {
            "ar_at_least_70pct_of_floor": ratios["ar_floor_fraction"] is not None
            and ratios["ar_floor_fraction"] >= TARGETS["ar_floor_fraction"],
            "verify16_at_most_2x_ar": ratios["verify16_over_ar"] is not None
            and ratios["verify16_over_ar"] <= TARGETS["verify16_over_ar"],
            "draft_at_most_0.35x_ar": ratios["draft_over_ar"] is not None
            and ratios["draft_over_ar"] <= TARGETS["draft_over_ar"],
        }
    return {
        "device": str(dev) if dev.type != "cuda" else f"cuda ({torch.cuda.get_device_name(dev)})",
        "layers": layers,
        "context": context,
        "dtype": str(dtype).removeprefix("torch."),
        "kv_dtype": kv,
        "kernels": kernels,
        "cuda_graphs": cuda_graphs,
        "bandwidth_gbps": bandwidth / 1e9 if bandwidth else None,
        "steps": [step.as_dict(bandwidth) for step in steps],
        "ratios": ratios,
        "targets": targets,
        "notes": notes,
    }


# --- output ---------------------------------------------------------------------------------------


def format_table(report: dict) -> str:
    def num(value, fmt):
        return format(value, fmt) if value is not None else "-"

    lines = [
        f"synthetic Gemma 4 26B-A4B + DFlash: {report['layers']} layer(s), context {report['context']}, "
        f"{report['dtype']}, KV {report['kv_dtype']}, kernels {report['kernels']}, {report['device']}",
        f"CUDA graphs: {report['cuda_graphs']}",
        "copy bandwidth: "
        + (f"{report['bandwidth_gbps']:.0f} GB/s" if report["bandwidth_gbps"] else "n/a (no floor on the CPU)"),
        f"{'step':<14}{'ms':>10}{'MB read':>11}{'GB/s':>9}{'of floor':>10}{'experts/layer':>15}",
    ]
    for row in report["steps"]:
        gbps = row["bytes"] / row["seconds"] / 1e9 if row["bytes"] and row["seconds"] else None
        frac = row["floor_fraction"]
        lines.append(
            f"{row['name']:<14}{num(row['seconds'] and 1000 * row['seconds'], '.2f'):>10}"
            f"{num(row['bytes'] and row['bytes'] / 1e6, '.1f'):>11}{num(gbps, '.1f'):>9}"
            f"{num(frac and 100 * frac, '.0f') + ('%' if frac else ''):>10}"
            f"{num(row['experts_per_layer'], '.1f'):>15}" + (f"  ({row['note']})" if row.get("note") else "")
        )
    r = report["ratios"]
    lines.append(
        f"verify(16) / AR = {num(r['verify16_over_ar'], '.2f')}, draft / AR = {num(r['draft_over_ar'], '.2f')}"
        + (f", draft-int4 / AR = {num(r['draft_int4_over_ar'], '.2f')}" if "draft_int4_over_ar" in r else "")
        + f", AR at {num(r['ar_floor_fraction'] and 100 * r['ar_floor_fraction'], '.0f')}% of its floor"
    )
    if report["targets"] is not None:
        for label, key in (
            ("AR >= 70% of floor", "ar_at_least_70pct_of_floor"),
            ("verify(16) <= 2x AR", "verify16_at_most_2x_ar"),
            ("draft <= 0.35x AR", "draft_at_most_0.35x_ar"),
        ):
            lines.append(f"target {label}: {'met' if report['targets'][key] else 'not met'}")
    lines.extend(
        f"{row['name']}: {describe_profile(row['kernel_profile'])}"
        for row in report["steps"]
        if row.get("kernel_profile")
    )
    lines.extend(f"note: {note}" for note in report["notes"])
    return "\n".join(lines)


def run_synthetic_bench(args) -> int:
    """The CLI entry: `flashdesk bench --synthetic ...`."""
    lengths = parse_prefill_lengths(args.prefill_lengths)
    if args.repeats is not None and args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    report = run_synthetic(
        layers=args.layers,
        context=args.context,
        device=args.device,
        dtype=args.dtype,
        kv_dtype=args.kv_dtype,
        prefill_lengths=lengths,
        repeats=args.repeats,
        profile=args.profile,
        capacity=args.capacity,
    )
    print(format_table(report), flush=True)
    if args.json:
        print(json.dumps(report), flush=True)
    return 0
