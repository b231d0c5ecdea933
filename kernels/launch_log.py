"""What a run launches, recorded without a GPU: to compile it, check it, or count it.

- `record_launches()` collects each distinct launch (kernel, argument types, constexprs, options)
  under Triton's interpreter, optionally without executing the kernels, so a full-size step's
  launches take seconds;
- `record_compiles()` collects each specialization Triton's real JIT would compile for a GPU, with
  the attributes its binder adds (16-byte aligned pointers, integers divisible by 16), through a
  stand-in driver on CPU tensors: nothing is compiled or run. Those attributes let the compiler
  vectorize and pipeline loads, so they change registers, shared memory and spills: this is what
  a GPU compiles, where hand-written specs and the interpreter's launches can only approximate it;
- `unlisted()` names the launches no hand-written `compile_specs()` of kernels.check lists;
- `compile_specs()` hands a saved recording to kernels.check:
      FLASHDESK_LAUNCH_LOG=launches.json python -m flashdesk.kernels.check \\
          --module flashdesk.kernels.launch_log --arch sm_90
- `count_kernels()` counts a block's Triton launches and computing torch ops (latency at batch 1);
- `launch_list()` keeps every one of them in order, with its grid and its tensors, for the
  performance model (kernels/perf_model.py) to cost a step launch by launch.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
from contextlib import contextmanager
from pathlib import Path

import torch

from flashdesk.kernels.backend import LAUNCH_STAGES, CompileSpec, interpreted, spec_key

LOG_VARIABLE = "FLASHDESK_LAUNCH_LOG"
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl")
POINTER_TYPES = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float8_e4m3fn": "fp8e4nv",
    "float8_e5m2": "fp8e5",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "i1",
}


def describe_launch(fn, args: tuple, kwargs: dict) -> dict:
    """One launch of the jitted Python function `fn` as plain data: every argument's Triton type
    ("*bf16", "i32", ...) or, for a constexpr, its value, plus the launch options ("pdl": True
    where it was launched with programmatic dependent launch)."""
    kwargs = dict(kwargs)
    options = {key: kwargs.pop(key) for key in LAUNCH_OPTIONS if key in kwargs}
    params = inspect.signature(fn).parameters
    bound = dict(zip(params, args)) | kwargs
    signature, constexprs = {}, {}
    for name, param in params.items():
        if name not in bound:
            continue  # a defaulted constexpr: the compile fills it in
        value = bound[name]
        if "constexpr" in str(param.annotation) or value is None:
            constexprs[name] = value
        else:
            signature[name] = _triton_type(name, value)
    launch = {
        "module": fn.__module__,
        "function": fn.__name__,
        "signature": signature,
        "constexprs": constexprs,
        "num_warps": options.get("num_warps", 4),
        "num_stages": options.get("num_stages", LAUNCH_STAGES),
    }  # Triton's default
    if options.get("maxnreg") is not None:
        launch["maxnreg"] = options["maxnreg"]
    if options.get("launch_pdl"):
        launch["pdl"] = True
    return launch


def _triton_type(name: str, value) -> str:
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in POINTER_TYPES:
            raise TypeError(f"argument {name}: no Triton pointer type for a {dtype} tensor")
        return "*" + POINTER_TYPES[dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"argument {name}: cannot type a {type(value).__name__} for a Triton launch")


@contextmanager
def _launches_through(run):
    """While the block runs, every interpreted launch calls run(launch_now, kernel, args, kwargs)
    instead, where launch_now() runs the launch as it would have run."""
    from triton.runtime.interpreter import InterpretedFunction

    original = InterpretedFunction.run

    def patched(self, *args, grid, warmup, **kwargs):
        return run(
            lambda: original(self, *args, grid=grid, warmup=warmup, **kwargs), self, args, dict(kwargs, grid=grid)
        )

    InterpretedFunction.run = patched
    try:
        yield
    finally:
        InterpretedFunction.run = original


@contextmanager
def record_launches(execute: bool = True):
    """Yield a list that collects each distinct launch (describe_launch) while the block runs.
    Needs TRITON_INTERPRET=1 from before triton was imported: launches go through the interpreter.
    With execute=False no kernel runs (outputs keep whatever torch.empty gave them): a full-size
    step's launches in seconds, for a run whose host side never reads a kernel's result."""
    launches: list[dict] = []
    seen: set[str] = set()

    def run(launch_now, kernel, args, kwargs):
        kwargs = {key: value for key, value in kwargs.items() if key != "grid"}
        launch = describe_launch(kernel.fn, args, kwargs)
        key = json.dumps(launch, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            launches.append(launch)
        return launch_now() if execute else None

    with _launches_through(run):
        yield launches


@contextmanager
def stand_in_driver(cap: int = 90):
    """Triton's JIT on CPU tensors for a CUDA card of compute capability `cap`: its binder needs a
    driver only for the target, the device and the stream. Launches cannot run (no GPU): use it
    with compiles only (warmup launches, kernels.compile_ahead) or with record_compiles."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from flashdesk.kernels import backend

    if interpreted():
        raise RuntimeError("the stand-in driver serves Triton's JIT: unset TRITON_INTERPRET before triton is imported")

    class StandIn:
        def get_current_target(self):
            return GPUTarget("cuda", cap, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    active = driver._active  # None until first asked for; asking would look for a real GPU
    driver.set_active(StandIn())
    backend._recording_compiles, before = True, backend._recording_compiles
    try:
        with backend.kernels("triton"):
            yield
    finally:
        backend._recording_compiles = before
        driver._active = active


@contextmanager
def record_compiles(cap: int = 90):
    """Yield a list that collects each specialization Triton's JIT would compile while the block
    runs on CPU tensors (describe_launch's fields, plus "attrs" by argument name). Nothing compiles
    and no kernel runs, so outputs hold garbage: for a block whose host side reads no kernel result
    (Engine.compile_kernels runs a whole generation's passes so)."""
    from triton.runtime.jit import JITFunction

    launches: list[dict] = []
    compile_for_real = JITFunction._do_compile

    def record(self, key, signature, device, constexprs, options, attrs, warmup):
        names = self.arg_names
        launch = {
            "module": self.fn.__module__,
            "function": self.fn.__name__,
            "signature": {name: kind for name, kind in signature.items() if kind != "constexpr"},
            "constexprs": {names[index]: value for (index, *_), value in constexprs.items()},
            "attrs": {names[index]: value for (index, *_), value in attrs.items() if value},
            "num_warps": options.num_warps,
            "num_stages": options.num_stages,
        }
        if options.maxnreg is not None:
            launch["maxnreg"] = options.maxnreg
        if launch not in launches:
            launches.append(launch)
        return None  # not compiled: the launch returns without running

    with stand_in_driver(cap):
        JITFunction._do_compile = record
        try:
            yield launches
        finally:
            JITFunction._do_compile = compile_for_real


def unlisted(launches: list[dict], modules=None) -> list[dict]:
    """The recorded launches that no hand-written spec of `modules` (kernels.check's SPEC_MODULES)
    compiles: same function, argument types, constexpr values as a GPU passes them (as_on_gpu;
    defaults filled in) and launch options."""
    from flashdesk.kernels.check import SPEC_MODULES, _specs

    listed = {
        spec_key(
            getattr(spec.fn, "fn", spec.fn),
            spec.signature,
            spec.constexprs,
            spec.num_warps,
            spec.num_stages,
            spec.maxnreg,
        )
        for module in (modules or SPEC_MODULES)
        for spec in _specs(module)
    }
    return [
        launch
        for launch in launches
        if spec_key(
            getattr(importlib.import_module(launch["module"]), launch["function"]),
            launch["signature"],
            as_on_gpu(launch),
            launch["num_warps"],
            launch["num_stages"],
            launch.get("maxnreg"),
        )
        not in listed
    ]


# torch ops that make a view or an uninitialized tensor: no kernel runs for them on a GPU
VIEW_OPS = (
    "empty",
    "view",
    "reshape",
    "slice",
    "select",
    "detach",
    "unsqueeze",
    "squeeze",
    "chunk",
    "split",
    "expand",
    "alias",
    "as_strided",
    "_unsafe_view",
    "aten.t.",
    "transpose",
    "permute",
)


@contextmanager
def count_kernels():
    """Yield a Counter of the kernels the block runs: each Triton launch by kernel name (counted,
    not executed, so the results are garbage) and each torch op that computes, by op name. At batch
    1 every kernel costs launch and tail latency whatever its size, so a step's count matters."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter = Counter()

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if not any(view in name for view in VIEW_OPS):
                counts[name] += 1
            return func(*args, **(kwargs or {}))

    def run(launch_now, kernel, args, kwargs):
        counts[kernel.fn.__name__] += 1

    with _launches_through(run), _Ops():
        yield counts


@contextmanager
def launch_list():
    """Yield a list that gets every kernel the block runs, in order: each Triton launch (counted,
    not executed: the results are garbage) as describe_launch's fields plus "grid", "programs",
    "tensors" (argument name -> tensor) and "scalars" (argument name -> number), each computing
    torch op as {"function": "aten...", "tensors": its tensor arguments and result}. The tensors let
    a caller say which bytes each launch moves: weights, KV, activations."""
    from torch.utils._python_dispatch import TorchDispatchMode

    kernels: list[dict] = []

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func)
            no_op = any(out is arg for arg in args)  # e.g. .to() of a tensor already there
            if not no_op and not any(view in name for view in VIEW_OPS):
                flat = [*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else (out,))]
                tensors = {f"arg{i}": t for i, t in enumerate(flat) if isinstance(t, torch.Tensor)}
                kernels.append({"function": name, "tensors": tensors})
            return out

    def run(launch_now, kernel, args, kwargs):
        grid = kwargs.pop("grid")
        launch = describe_launch(kernel.fn, args, kwargs)
        names = list(inspect.signature(kernel.fn).parameters)
        bound = dict(zip(names, args)) | kwargs
        launch["grid"] = tuple(grid(bound) if callable(grid) else grid)
        launch["programs"] = math.prod(int(n) for n in launch["grid"])
        launch["tensors"] = {name: value for name, value in bound.items() if isinstance(value, torch.Tensor)}
        launch["scalars"] = {
            name: value
            for name, value in bound.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        kernels.append(launch)

    with _launches_through(run), _Ops():
        yield kernels


def save(launches: list[dict], path: str | Path) -> None:
    Path(path).write_text(json.dumps(launches, indent=1))


def compile_specs() -> list[CompileSpec]:
    """The launches saved at $FLASHDESK_LAUNCH_LOG as specs for `flashdesk.kernels.check`."""
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        raise RuntimeError(f"set {LOG_VARIABLE} to a file written by launch_log.save()")
    specs = []
    for i, launch in enumerate(json.loads(Path(path).read_text())):
        fn = getattr(importlib.import_module(launch["module"]), launch["function"])
        constexprs = launch["constexprs"] if "attrs" in launch else as_on_gpu(launch)  # the JIT's: as on a GPU
        types = ",".join(t.lstrip("*") for t in dict.fromkeys(launch["signature"].values()))
        consts = ",".join(f"{k}={v}" for k, v in constexprs.items())
        specs.append(
            CompileSpec(
                f"{launch['function']}#{i}[{types}|{consts}]",
                fn,
                launch["signature"],
                constexprs,
                launch["num_warps"],
                launch["num_stages"],
                launch.get("attrs", {}),
                launch.get("maxnreg"),
            )
        )
    return specs


def as_on_gpu(launch: dict) -> dict:
    """The launch's constexprs as a GPU would pass them. The interpreter sets DOT_FP32 for every
    launch (its bf16 dot is broken); a GPU sets it only where the activations (the first pointer)
    are fp32, and a kernel that a GPU launches with False dots fp32 inputs in fp32 all the same."""
    constexprs = dict(launch["constexprs"])
    if "DOT_FP32" in constexprs:
        first_pointer = next((t for t in launch["signature"].values() if t.startswith("*")), None)
        constexprs["DOT_FP32"] = first_pointer == "*fp32"
    return constexprs
