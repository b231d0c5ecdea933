"""Compile every Triton kernel specialization for each card and report registers, shared memory
and spills, so a kernel that fails or spills on one architecture is caught here, without a GPU.

    python -m flashdesk.kernels.check --arch sm_86,sm_89,sm_90,sm_120 [--json] [--kernel SUBSTR]

Each module in SPEC_MODULES lists its specializations with `compile_specs()` (backend.CompileSpec);
tests/test_launch_log.py checks those lists against what the engine launches at the real shapes.
A spec compiles with the marks Triton's JIT adds at the real shapes (`jit_attrs`: every pointer
16-byte aligned, every integer it specializes divisible by 16, unless it names its own `attrs`:
launch_log.record_compiles takes them from the JIT), since they change how the compiler loads, and
so registers, shared memory and instructions. Every spec is compiled for every arch to a
cubin with `triton.compile` (no GPU or driver needed); the wheel's own `cuobjdump
--dump-resource-usage` then reads registers and per-thread local memory.
Spills land in the stack frame (cuobjdump's STACK; its LOCAL stays 0), so `local_bytes` is
STACK + LOCAL, and ptxas's own "bytes spill stores" tells a spill from a local array. Shared
memory is mostly dynamic (Triton's `metadata.shared`), so `shared_bytes` adds it to the static
SHARED and is checked against the card's per-block limit, which Triton only checks at launch.

Compiles run in freshly spawned processes with the interpreter off: with TRITON_INTERPRET set,
`triton.jit` returns the interpreter's function, and running the interpreter patches
triton.language for good. Triton's cache and temp files go to a folder removed afterwards.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, redirect_stdout
from multiprocessing import get_context

from flashdesk.kernels import result_cache

SPEC_MODULES = (
    "flashdesk.kernels.linear_triton",
    "flashdesk.kernels.moe_triton",
    "flashdesk.kernels.attention_triton",
    "flashdesk.kernels.norm_triton",
    "flashdesk.kernels.layer_norms_triton",
    "flashdesk.kernels.qkv_triton",
    "flashdesk.kernels.o_proj_triton",
    "flashdesk.kernels.router_triton",
    "flashdesk.kernels.kv_write",
    "flashdesk.kernels.rope_triton",
)
ARCHS = ("sm_86", "sm_89", "sm_90", "sm_120")
# Opt-in shared memory per block (CUDA programming guide, "Technical Specifications").
SHARED_LIMIT = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 120: 101376}


def capability(arch: str | int) -> int:
    """'sm_86', 'sm86', 'sm_90a' or 86 -> 86."""
    text = str(arch).strip().lower().removeprefix("sm").lstrip("_").removesuffix("a")
    if not text.isdigit():
        raise ValueError(f"unknown arch {arch!r}: use e.g. sm_86")
    return int(text)


def check(
    archs=ARCHS, kernel_filter: str | None = None, modules=SPEC_MODULES, workers: int | None = None, perf: bool = False
) -> list[dict]:
    """Compile each spec of `modules` whose name contains `kernel_filter` for every arch.

    A module is "pkg.mod" (its compile_specs) or "pkg.mod:function". Returns one row per
    (kernel, arch): kernel, module, arch, ok, error, registers, shared_bytes, local_bytes,
    stack_bytes, spill_stores, seconds (of one compile), pdl (its PTX waits on the kernels
    before it: compiled with PDL, as on sm_90 and later), prefetch (it asks L2 for its first
    weights before that wait); a module that cannot be imported or
    listed gives one row with arch "all". ok is False on a compile error, local memory
    (local_bytes > 0: spills) or shared memory over the card's per-block limit; error says which.
    With `perf`, each compiled row also has spill_bytes (local_bytes), the performance model's
    fields (perf_model.row_perf, from the SASS main loop) and `key`, the launch key a step's launch
    list matches it by.
    A row is kept in the result cache (result_cache.py) under its kernel sources, spec, Triton
    version and arch: an unchanged kernel is not compiled again.
    """
    caps = [capability(a) for a in archs]
    workers = workers or os.cpu_count() or 1
    with (
        tempfile.TemporaryDirectory(prefix="flashdesk-check-") as tmp,
        _worker_env(tmp),
        ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker) as pool,
    ):
        listings = [(module, _submit(pool, _list_specs, module)) for module in modules]
        # rows of failed modules and (module, name, cap, key, future) in report order
        entries: list[dict | tuple[str, str, int, str | None, Future]] = []
        for module, future in listings:
            listing, died = _outcome(future)
            names, error = listing or ([], died)
            if error:
                entries.append(_row(module, module, "all", error=error))
                continue
            for index, name in enumerate(names):
                if kernel_filter and kernel_filter not in name:
                    continue
                for cap in caps:
                    key = result_cache.key(module, index, name, cap, perf)
                    cached = result_cache.get(key)
                    entries.append(
                        cached
                        if cached is not None
                        else (module, name, cap, key, _submit(pool, _compile, module, index, name, cap, perf))
                    )
        return [entry if isinstance(entry, dict) else _compiled(*entry) for entry in entries]


def _compiled(module: str, name: str, cap: int, key: str | None, future: Future) -> dict:
    row, died = _outcome(future)
    if row is None:
        return _row(name, module, f"sm_{cap}", error=died)
    result_cache.put(key, row)
    return row


def _submit(pool: ProcessPoolExecutor, fn, *args) -> Future:
    """pool.submit, but a pool broken by a dead worker gives a failed future, not a raise."""
    try:
        return pool.submit(fn, *args)
    except BrokenProcessPool as exc:
        future: Future = Future()
        future.set_exception(exc)
        return future


def _outcome(future: Future) -> tuple:
    """(result, None), or (None, error) if the worker died (a crash in the compiler or in an
    imported module breaks the pool, so the compiles after it fail too)."""
    try:
        return future.result(), None
    except Exception as exc:  # noqa: BLE001 - the workers catch their own errors
        return None, f"compile worker died: {_describe(exc)}"


def _row(kernel, module, arch, error=None, **usage) -> dict:
    row = {
        "kernel": kernel,
        "module": module,
        "arch": arch,
        "ok": error is None,
        "error": error,
        "registers": None,
        "shared_bytes": None,
        "local_bytes": None,
        "stack_bytes": None,
        "spill_stores": None,
        "seconds": None,
    }
    row.update(usage)
    return row


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 4000 else text[:4000] + " ..."


@contextmanager
def _worker_env(tmp: str):
    """Environment the spawned workers start with (they copy it at spawn): no interpreter, and
    Triton's cache, home and temp files under `tmp`."""
    os.makedirs(os.path.join(tmp, "tmp"))
    values = {
        "TRITON_INTERPRET": "0",
        "TRITON_DUMP_PTXAS_LOG": "1",
        "TRITON_CACHE_DIR": os.path.join(tmp, "cache"),
        "TRITON_HOME": tmp,
        "TMPDIR": os.path.join(tmp, "tmp"),
        "TRITON_DEFAULT_FP_FUSION": os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"),
    }
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _init_worker() -> None:
    """Keep the parent's stdout clean (--json): Triton prints failing PTX there, ptxas may too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")


@functools.lru_cache(maxsize=None)
def _specs(module: str) -> tuple:
    name, _, attr = module.partition(":")
    provider = getattr(importlib.import_module(name), attr or "compile_specs")
    return tuple(provider())


def _list_specs(module: str) -> tuple[list[str], str | None]:
    """Worker: the spec names, or the error (as text: any exception must reach the parent)."""
    try:
        return [spec.name for spec in _specs(module)], None
    except Exception as exc:  # noqa: BLE001 - a missing or broken module is its row
        return [], _describe(exc)


def _compile(module: str, index: int, name: str, cap: int, perf: bool = False) -> dict:
    """Worker: compile one spec for one arch and read its resource usage from the cubin (with
    `perf`, its SASS main loop too)."""
    arch = f"sm_{cap}"
    try:
        spec = _specs(module)[index]  # imports the module on this worker's first compile
        if spec.name != name:
            raise RuntimeError(f"{module} listed {name!r} but now has {spec.name!r} there")
        start = time.perf_counter()
        with redirect_stdout(io.StringIO()) as log:  # TRITON_DUMP_PTXAS_LOG prints there
            compiled = _triton_compile(spec, cap)
        usage = _resource_usage(compiled.asm["cubin"])
        seconds = round(time.perf_counter() - start, 2)
    except Exception as exc:  # noqa: BLE001 - every failure is reported as this spec's row
        return _row(name, module, arch, error=_describe(exc))
    shared = usage["SHARED"] + int(compiled.metadata.shared)
    local = usage["STACK"] + usage["LOCAL"]
    spills = re.search(r"(\d+) bytes spill stores", log.getvalue())
    spill_stores = int(spills.group(1)) if spills else None
    error = None
    if local:
        error = f"local memory: {local} bytes per thread ({spill_stores} bytes of spill stores)"
    elif shared > SHARED_LIMIT.get(cap, shared):
        error = f"shared memory {shared} bytes is over {arch}'s {SHARED_LIMIT[cap]} bytes per block"
    row = _row(
        name,
        module,
        arch,
        error=error,
        registers=usage["REG"],
        shared_bytes=shared,
        local_bytes=local,
        stack_bytes=usage["STACK"],
        spill_stores=spill_stores,
        seconds=seconds,
        pdl=pdl_in_ptx(compiled.asm["ptx"]),
        prefetch=prefetch_in_ptx(compiled.asm["ptx"]),
    )
    if perf:
        row["spill_bytes"] = local
        try:
            row.update(_perf_fields(spec, compiled, cap, usage["REG"], shared))
        except Exception as exc:  # noqa: BLE001 - the compile stands; the model says what failed
            row["perf_error"] = _describe(exc)
    return row


def pdl_in_ptx(ptx: str) -> bool:
    """Whether a kernel runs under programmatic dependent launch safely and usefully: it waits
    (griddepcontrol.wait) before its first global load, store or atomic, and releases the next
    kernel (griddepcontrol.launch_dependents: a Triton that drops it as dead code would not).
    Where the compiler copies the wait into a branch's block, laid out later in the text (a kernel
    that prefetches on one branch), no access of that block may come before its copy either."""
    accesses = re.compile(r"\b(ld|st|atom|red|cp\.async)\.(global|async)|\bcp\.async")
    lines = ptx.splitlines()
    wait = next((i for i, line in enumerate(lines) if "griddepcontrol.wait" in line), None)
    first = next((i for i, line in enumerate(lines) if accesses.search(line)), None)
    released = any("griddepcontrol.launch_dependents" in line for line in lines)
    accessed = False  # in the basic block so far (blocks start at $L__BB labels)
    for line in lines:
        if line.startswith("$L__BB"):
            accessed = False
        elif "griddepcontrol.wait" in line and accessed:
            return False
        accessed = accessed or bool(accesses.search(line))
    return wait is not None and released and (first is None or wait < first)


def prefetch_in_ptx(ptx: str) -> bool:
    """Whether a kernel asks L2 for data before its wait (grid_dependency.prefetch_rows): its
    first loads' DRAM latency then passes while the kernel before it drains. The compiler may copy
    the wait into each branch (a dense chunk's program prefetches, an expert's cannot) and lay the
    prefetching one out last: a prefetch before the last wait in the text counts."""
    lines = ptx.splitlines()
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    return bool(waits) and any("prefetch.global.L2" in line for line in lines[: waits[-1]])


def _perf_fields(spec, compiled, cap: int, registers: int, shared: int) -> dict:
    from flashdesk.kernels import perf_model, sass
    from flashdesk.kernels.backend import spec_key

    code = sass.disassemble(compiled.asm["cubin"], _cuobjdump())
    loop = sass.main_loop(code)
    fields = perf_model.row_perf(
        f"sm_{cap}", spec.fn.fn.__name__, spec.constexprs, spec.num_warps, spec.num_stages, registers, shared, loop
    )
    fields["kernel_instructions"] = len(sass.parse(code))  # every instruction once: what a fused tail issues
    fields["in_flight_ok"] = perf_model.in_flight_floor_ok(fields, cap)
    fields["key"] = repr(
        spec_key(spec.fn, spec.signature, spec.constexprs, spec.num_warps, spec.num_stages, spec.maxnreg)
    )
    return fields


def _triton_compile(spec, cap: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from flashdesk.kernels.backend import PDL_CAPABILITY

    signature, constexprs = _full_signature(spec)
    if "PDL" in spec.fn.arg_names:  # the arch decides it, as backend.pdl_options does on a card
        constexprs["PDL"] = cap >= PDL_CAPABILITY
    attrs = {(spec.fn.arg_names.index(name),): value for name, value in jit_attrs(spec).items()}
    source = ASTSource(fn=spec.fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.maxnreg is not None:
        options["maxnreg"] = spec.maxnreg
    return triton.compile(source, target=GPUTarget("cuda", cap, 32), options=options)


def jit_attrs(spec) -> dict[str, list]:
    """The marks Triton's JIT adds when the engine launches the spec at the real shapes (the spec's
    own attrs where it names them): every pointer is 16-byte aligned, and every integer argument
    the kernel lets Triton specialize is divisible by 16 (the real model's widths, head dims,
    windows, splits and strides all are; row counts and lengths are in do_not_specialize). The
    marks let the compiler vectorize loads: without D's, the norm chains compiled to scalar,
    predicated loads, 2.5x the instructions. test_launch_log checks them against the JIT's own."""
    if spec.attrs:
        return dict(spec.attrs)
    fn = spec.fn  # a JITFunction, or the interpreter's function (which keeps the decorator's kwargs)
    kept = getattr(fn, "do_not_specialize", None) or getattr(fn, "kwargs", {}).get("do_not_specialize") or ()
    kept = {fn.arg_names[name] if isinstance(name, int) else name for name in kept}
    return {
        name: [["tt.divisibility", 16]]
        for name, kind in spec.signature.items()
        if kind.startswith("*") or (kind in ("i32", "i64") and name not in kept)
    }


def _full_signature(spec) -> tuple[dict, dict]:
    """Every argument in order, constexprs as "constexpr" with their values, defaults filled in:
    ASTSource ignores Python defaults, and a missing value fails deep in codegen on a None."""
    from triton.runtime.jit import JITFunction

    fn = spec.fn
    if not isinstance(fn, JITFunction):
        raise TypeError(
            f"{spec.name}: fn is {type(fn).__name__}, not a triton.jit function "
            "(was TRITON_INTERPRET set when its module was imported?)"
        )
    unknown = (set(spec.signature) | set(spec.constexprs) | set(spec.attrs)) - set(fn.arg_names)
    if unknown:
        raise ValueError(f"{spec.name}: no argument(s) {sorted(unknown)} in {fn.__name__}{_args(fn)}")
    signature, constexprs, missing = {}, dict(spec.constexprs), []
    for param in fn.params:
        kind = spec.signature.get(param.name)
        if param.name in constexprs or (kind is None and param.is_constexpr) or kind == "constexpr":
            if param.name not in constexprs and param.has_default:
                constexprs[param.name] = param.default
            kind = "constexpr" if param.name in constexprs else None
        if kind is None:
            missing.append(param.name)
        signature[param.name] = kind
    if missing:
        raise ValueError(f"{spec.name}: no type or constexpr value for {missing} in {fn.__name__}{_args(fn)}")
    return signature, constexprs


def _args(fn) -> str:
    return str(inspect.signature(fn.fn))


def _cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """REG, STACK, SHARED, LOCAL of the cubin, each the max over its functions."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run(
            [_cuobjdump(), "--dump-resource-usage", file.name], check=True, capture_output=True, text=True
        ).stdout
    return parse_resource_usage(text)


def parse_resource_usage(text: str) -> dict[str, int]:
    """Parse `cuobjdump --dump-resource-usage`: per function "REG:28 STACK:0 SHARED:0 LOCAL:0"."""
    usage = {"REG": 0, "STACK": 0, "SHARED": 0, "LOCAL": 0}
    functions = 0
    for line in text.splitlines():
        fields = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", line))
        if "REG" in fields:
            functions += 1
            for key, value in fields.items():
                usage[key] = max(usage[key], int(value))
    if not functions:
        raise RuntimeError(f"no function in cuobjdump's resource usage:\n{text}")
    return usage


def format_table(rows: list[dict], wall: float | None = None) -> str:
    """Kernel x arch table plus a one-line summary."""
    width = max([len("kernel")] + [len(r["kernel"]) for r in rows])
    lines = [f"{'kernel':<{width}}  {'arch':<7} {'regs':>5} {'shared':>8} {'local':>6} {'secs':>6}  status"]
    for r in rows:
        cells = [_cell(r[k]) for k in ("registers", "shared_bytes", "local_bytes", "seconds")]
        status = "ok" if r["ok"] else "FAIL " + _headline(r["error"])
        lines.append(
            f"{r['kernel']:<{width}}  {r['arch']:<7} {cells[0]:>5} {cells[1]:>8} {cells[2]:>6} {cells[3]:>6}  {status}"
        )
    lines.append(_summary(rows, wall))
    return "\n".join(lines)


def _headline(error: str) -> str:
    """First and last line: a CompilationError's first line is only where, its last one what."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    text = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= 200 else text[:197] + "..."


def _cell(value) -> str:
    return "-" if value is None else str(value)


def _summary(rows: list[dict], wall: float | None) -> str:
    spills = sum(1 for r in rows if (r["local_bytes"] or 0) > 0)
    failed = sum(1 for r in rows if not r["ok"])
    compile_s = sum(r["seconds"] or 0 for r in rows)
    text = (
        f"{len(rows)} rows: {len(rows) - failed} ok, {failed} failed ({spills} spilling); {compile_s:.1f} s of compiles"
    )
    return text + (f", {wall:.1f} s wall" if wall is not None else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashdesk.kernels.check",
        description="Compile the Triton kernels for each card and "
        "fail on compile errors, spills or too much shared memory.",
    )
    parser.add_argument("--arch", default=",".join(ARCHS), help="comma-separated archs (default: %(default)s)")
    parser.add_argument("--kernel", help="only kernels whose name contains this")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    parser.add_argument(
        "--module", action="append", help="spec module (pkg.mod or pkg.mod:function) instead of the engine's"
    )
    parser.add_argument("--workers", type=int, help="parallel compiles (default: all cores)")
    parser.add_argument(
        "--perf",
        action="store_true",
        help="also model each kernel (occupancy, bytes in flight, instructions per key) "
        "and each decode step on the cards of the compiled archs (kernels/perf_model.py)",
    )
    args = parser.parse_args(argv)
    archs = [a for a in args.arch.split(",") if a.strip()]
    start = time.perf_counter()
    rows = check(archs, args.kernel, tuple(args.module or SPEC_MODULES), args.workers, perf=args.perf)
    report = perf_report(rows, archs) if args.perf else None
    wall = time.perf_counter() - start
    if args.json:
        print(json.dumps(report if report is not None else rows, indent=1))
    else:
        print(format_table(rows, wall))
        if report is not None:
            print(format_perf(report))
    return 0 if rows and all(r["ok"] for r in rows) else 1


def perf_report(rows: list[dict], archs) -> dict:
    """{"label", "rows", "steps"}: the compiled rows with their model fields, and every recorded
    decode step modeled on the cards of `archs` (perf_model.model_steps)."""
    from flashdesk.kernels import perf_model

    caps = {capability(a) for a in archs}
    cards = [card for card in perf_model.CARDS.values() if card.capability in caps]
    report = {"label": perf_model.MODEL_LABEL, "rows": rows, "steps": []}
    try:
        report["steps"] = perf_model.model_steps(rows, perf_model.record_steps(), cards)
    except Exception as exc:  # noqa: BLE001 - the kernel rows still stand
        report["steps_error"] = _describe(exc)
    return report


def format_perf(report: dict) -> str:
    """The model's tables: streaming rows (occupancy, bytes in flight) and modeled steps."""
    lines = [
        f"\nPerformance model: {report['label']}",
        f"{'kernel':<58} {'arch':<7} {'role':<7} {'blk/SM':>6} {'KiB in flight/SM':>16} {'instr/key':>9}  floor",
    ]
    for r in report["rows"]:
        if r.get("role") not in ("weights", "kv"):
            continue
        in_flight = r["bytes_in_flight_per_sm"]
        lines.append(
            f"{r['kernel'][:58]:<58} {r['arch']:<7} {r['role']:<7} {_cell(r['blocks_per_sm']):>6} "
            f"{'-' if in_flight is None else f'{in_flight / 1024:.1f}':>16} "
            f"{_cell(r.get('instructions_per_key')):>9}  {'ok' if r['in_flight_ok'] else 'BELOW'}"
        )
    if report.get("steps_error"):
        lines.append(f"steps not modeled: {_headline(report['steps_error'])}")
    lines.append(
        f"\n{'card':<8} {'step':<10} {'capacity':>8} {'length':>6} {'launches':>8} {'GB':>6} "
        f"{'floor ms':>8} {'model ms':>8} {'of floor':>8}"
    )
    for s in report["steps"]:
        lines.append(
            f"{s['card']:<8} {s['step']:<10} {s['capacity']:>8} {s['length']:>6} {s['launches']:>8} "
            f"{s['bytes'] / 1e9:>6.2f} {1000 * s['floor_seconds']:>8.3f} {1000 * s['modeled_seconds']:>8.3f} "
            f"{s['floor_fraction']:>8.0%}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
