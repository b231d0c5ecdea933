"""Which implementation runs the kernels: Triton or plain torch, chosen once per process.

Default: Triton on CUDA tensors, torch elsewhere. `FLASHDESK_KERNELS=triton|torch` overrides it;
with `TRITON_INTERPRET=1 FLASHDESK_KERNELS=triton` the Triton kernels run on CPU tensors through
Triton's interpreter, which is how the tests check them without a GPU. Every dispatcher in
`flashdesk.kernels` asks `use_triton(tensor, family)`; `describe()` names the choice for `doctor`
and `generate --json`. A family (KERNELS) that failed its self-test on this card
(kernels/self_test.py) falls back to its torch path alone (`fall_back`); FLASHDESK_INJECT_FAULT
makes chosen families return wrong values, so tests can check that a self-test catches them.

`CompileSpec` is how each Triton module lists the specializations the engine launches for the
real model shapes, so `python -m flashdesk.kernels.check` can compile all of them for every card.
"""

from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache

import torch

CHOICES = ("triton", "torch")
_override: str | None = None
_recording_compiles = False  # launch_log.record_compiles: CPU tensors go through Triton's JIT, which records


@cache
def _environment_choice() -> str | None:
    """FLASHDESK_KERNELS, read once: every kernel call asks, and an environment lookup costs more
    than the rest of the dispatch (about 0.5 us, a few percent of a decode step on the CPU)."""
    value = os.environ.get("FLASHDESK_KERNELS", "").strip().lower()
    if value and value not in CHOICES:
        raise ValueError(f"FLASHDESK_KERNELS={value!r}: use triton or torch")
    return value or None


def _choice() -> str | None:
    return _override if _override is not None else _environment_choice()


def interpreted() -> bool:
    """Triton kernels run on the CPU through Triton's interpreter (set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def _interpreter_dots_row_by_row() -> None:
    """Make the interpreter's fp32 `tl.dot` batch invariant, as the GPU's is.

    The interpreter computes `tl.dot` with numpy's matmul, whose BLAS may sum a row's products in an
    order that depends on how many rows the call has (it did on an AVX-512 EPYC, 2026-12-01): rows of
    a 16-row call then differ in the last bit from the same rows computed alone, and speculation could
    change greedy output under the interpreter. A GPU tile sums each row in a fixed order whatever
    the other rows; computing each row of a 2-D fp32 dot on its own gives the interpreter the same."""
    try:
        import numpy as np
        import triton.runtime.interpreter as interpreter
    except ImportError:
        return
    plain_dot = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, *options):
        if a.data.ndim != 2 or a.data.dtype != np.float32 or b.data.dtype != np.float32:
            return plain_dot(self, a, b, d, *options)
        rows = [np.matmul(row[None, :], b.data, dtype=d.data.dtype) for row in a.data]
        return interpreter.TensorHandle(np.concatenate(rows) + d.data, d.dtype.scalar)

    interpreter.InterpreterBuilder.create_dot = create_dot


def _interpreter_rounds_bf16_to_nearest() -> None:
    """Make the interpreter's fp32 -> bf16 casts round to nearest even, as a GPU's do.

    The interpreter truncates (it drops the low 16 bits), so every bf16 a kernel stored under it
    could be one unit lower than the GPU's, and a fused kernel could not be checked to round exactly
    where the unfused torch ops round. torch's own conversion rounds to nearest even."""
    try:
        import numpy as np
        import triton.language as tl
        import triton.runtime.interpreter as interpreter
    except ImportError:
        return
    plain_cast = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return plain_cast(self, src, dst_type)
        rounded = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.bfloat16)
        return interpreter.TensorHandle(rounded.view(torch.int16).numpy().view(np.uint16), dst_type.scalar)

    interpreter.InterpreterBuilder.cast_impl = cast_impl


if interpreted():
    _interpreter_dots_row_by_row()
    _interpreter_rounds_bf16_to_nearest()


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(x: torch.Tensor | torch.device, kernel: str | None = None) -> bool:
    """Whether kernels on this tensor's device run as Triton (else the torch reference); with
    `kernel` (a family of KERNELS), whether that family does: not where it fell back."""
    device = x if isinstance(x, torch.device) else x.device
    choice = _choice()
    if choice == "torch":
        return False
    if choice == "triton":
        if device.type != "cuda" and not (interpreted() or _recording_compiles):
            raise RuntimeError(
                "FLASHDESK_KERNELS=triton on CPU tensors needs TRITON_INTERPRET=1 (set before triton is imported)"
            )
        on = True
    else:
        on = device.type == "cuda" and triton_available()
    return on and (kernel is None or kernel not in _fallbacks or _ignoring_fallbacks)


def describe(device: torch.device | str) -> str:
    """'triton', 'triton (interpreter)' or 'torch': what runs the kernels on this device."""
    device = torch.device(device)
    if not use_triton(device):
        return "torch"
    return "triton (interpreter)" if device.type != "cuda" else "triton"


# ----------------------------------------------------------------------------- per-kernel fallback

# The kernel families a self-test checks and a fallback replaces, by the dispatcher that runs them.
KERNELS = {
    "linear": "int4 and bf16 linears (GEMV with split-K, prefill tiles)",
    "glu_linear": "the MLPs' gate_up projections with their activation",
    "rope": "a step's positions and RoPE tables",
    "rms_norm": "RMSNorm with the residual add and scale",
    "add_norm": "the drafter's residual add with its norm",
    "head_norms": "q/k/v head norms with RoPE and the K/V store",
    "qkv_heads": "a decode step's q/k/v projection fused with its head norms and K/V store",
    "attention_out_norms": "the norms after attention",
    "o_proj_norms": "a decode step's attention output projection fused with the norms after it",
    "mlp_out_norms": "the norms after the MLPs",
    "router": "routing (softmax, top-k)",
    "moe": "the fused MoE (with its router for decode and verify blocks)",
    "kv_write": "the K/V cache write",
    "decode_attention": "decode and verify attention over the cache",
    "prefill_attention": "prefill attention",
}
# A decode or verify step's K/V go into the cache inside the head norms' kernel (with the cache
# write's code) and are read where they are by decode attention: all three, or the torch path's
STEP_FAMILIES = ("head_norms", "kv_write", "decode_attention")
_fallbacks: dict[str, str] = {}  # family -> why it runs on torch
_ignoring_fallbacks = False


def fall_back(name: str, why: str) -> None:
    """Run kernel family `name` on its torch path from now on (until clear_fallbacks)."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel family {name!r}: one of {', '.join(KERNELS)}")
    _fallbacks[name] = why


def fallbacks() -> dict[str, str]:
    """The families that run on their torch path, with why."""
    return dict(_fallbacks)


def clear_fallbacks() -> None:
    _fallbacks.clear()


@contextmanager
def ignoring_fallbacks():
    """The block runs every family as `kernels` says, fallbacks or not (the self-tests)."""
    global _ignoring_fallbacks
    previous, _ignoring_fallbacks = _ignoring_fallbacks, True
    try:
        yield
    finally:
        _ignoring_fallbacks = previous


FAULT_VARIABLE = "FLASHDESK_INJECT_FAULT"  # a testing aid: see injected_faults


@cache
def _fault_spec() -> tuple[frozenset, frozenset]:
    value = os.environ.get(FAULT_VARIABLE, "").strip()
    names, captures = set(), set()
    for item in filter(None, (part.strip() for part in value.split(","))):
        if item == "all":
            names |= set(KERNELS)
        elif item.startswith("capture:"):
            captures.add(item.removeprefix("capture:"))
        elif item in KERNELS:
            names.add(item)
        else:
            raise ValueError(
                f"{FAULT_VARIABLE}: unknown {item!r}; use all, kernel names ({', '.join(KERNELS)}) "
                "or capture:STEP (decode, verify, draft, context)"
            )
    return frozenset(names), frozenset(captures)


def injected_faults() -> frozenset[str]:
    """The kernel families FLASHDESK_INJECT_FAULT (a testing aid: `all` or comma-separated names)
    makes return wrong values on the Triton path, so tests can check a self-test catches them."""
    return _fault_spec()[0]


def injected_capture_fault(step: str) -> bool:
    """Whether FLASHDESK_INJECT_FAULT names capture:STEP: that step's CUDA graph capture fails."""
    return step in _fault_spec()[1]


def faulty(name: str, value):
    """value, or (with `name` injected) a wrong one: the first floating tensor in it becomes
    1 - 2 x value in place (every element off by at least its own magnitude)."""
    if name not in injected_faults():
        return value
    for t in [value] if isinstance(value, torch.Tensor) else value if isinstance(value, (tuple, list)) else []:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.element_size() > 1:
            t.mul_(-2).add_(1)
            break
    return value


@contextmanager
def kernels(choice: str):
    """Run a block with one implementation (tests compare both in one process)."""
    global _override
    if choice not in CHOICES:
        raise ValueError(f"unknown kernels {choice!r}: use triton or torch")
    previous, _override = _override, choice
    try:
        yield
    finally:
        _override = previous


# Every row count and length a kernel takes as an integer argument is in its do_not_specialize:
# Triton otherwise compiles a kernel again for a count of 1 and for counts divisible by 16, so a
# prompt's length would decide when a user waits for a compile (test_compile_ahead checks it). So
# is a cache's capacity (a full layer's is the context the user chose): the binary a card runs
# does not depend on that choice, and kernels.check compiles it whatever the choice.


# Pipelining depth of the kernels that choose no other: Triton's CUDA default, but passed at every
# launch, so a launch and the CompileSpec that kernels.check compiles for it cannot drift apart.
def device_start(start, device) -> torch.Tensor:
    """A block's first position as a 1-element int32 device tensor (a Python int is copied over):
    what the cache write and decode attention read on the device, so a step has no host-side shape."""
    if isinstance(start, torch.Tensor):
        return start.reshape(1).to(device=device, dtype=torch.int32)
    return torch.tensor([start], dtype=torch.int32, device=device)


ARRIVAL_COUNTERS = 512  # program groups a launch may count in at once (a split linear's output tiles)


@cache
def arrival_counters(device: torch.device) -> torch.Tensor:
    """The int32 counters on which a launch's programs count themselves in, so that the last of a
    group to finish runs the group's epilogue (a split linear's sum, the router's routing, decode
    attention's combine). Zeroed once and left at zero by every launch (the last program resets
    its group's), so launches in one stream and CUDA graphs share them. Two invariants keep that
    true: every launch that counts runs on the engine's one stream (a second stream running such
    kernels alongside would mix its arrivals in), and the first launch, which allocates them, is a
    warm-up before any graph capture (inside one they would come from the graph's private pool).
    Two banks of ARRIVAL_COUNTERS: a launch that counts at two levels (the fused q/k/v projection's
    split tiles, then its head groups) takes the second bank for the second level."""
    return torch.zeros(2 * ARRIVAL_COUNTERS, dtype=torch.int32, device=device)


PDL_CAPABILITY = 90  # programmatic dependent launch: sm_90 (Hopper) and later
PDL_VARIABLE = "FLASHDESK_PDL"  # 0 turns it off (a fault to rule out on a new driver)
PDL_ON = {"PDL": True, "launch_pdl": True}  # the kernel's constexpr and Triton's launch option
_pdl_recording = False
_pdl_off: str | None = None  # why PDL is off for this process (the self-tests passed only without it)


@cache
def _pdl_allowed() -> bool:
    value = os.environ.get(PDL_VARIABLE, "").strip().lower()
    if value and value not in ("0", "1"):
        raise ValueError(f"{PDL_VARIABLE}={value!r}: use 1 (the default on sm_90 and later) or 0")
    return value != "0"


@cache
def _pdl_capable(index: int) -> bool:
    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor >= PDL_CAPABILITY and _triton_has_pdl()


PDL_TRITON = (3, 9)  # the Triton whose PTX kernels.check read: the wait first, and the release kept


@cache
def _triton_has_pdl() -> bool:
    """Whether this Triton launches with PDL and emits both instructions as kernels.check found
    (an older one may not know `launch_pdl`, or drop the release as dead code)."""
    try:
        import triton
    except ImportError:
        return False
    version = tuple(int(part) for part in triton.__version__.split(".")[:2] if part.isdigit())
    return version >= PDL_TRITON


def pdl_options(device: torch.device) -> dict:
    """The launch options of every kernel (grid_dependency.enter): PDL_ON on a card of compute
    capability 9.0 or later unless FLASHDESK_PDL=0 or turn_off_pdl, else none. While
    `recording_pdl` runs, PDL_ON whatever the device: a recorder that never runs its launches notes
    them as such a card's."""
    if _pdl_recording:
        return PDL_ON
    if device.type != "cuda" or interpreted() or not _pdl_allowed() or _pdl_off:
        return {}
    return PDL_ON if _pdl_capable(device.index if device.index is not None else torch.cuda.current_device()) else {}


def turn_off_pdl(why: str | None) -> None:
    """Launch without PDL from now on (why: in words), or with it again (None)."""
    global _pdl_off
    _pdl_off = why


def pdl_off_reason() -> str | None:
    return _pdl_off


@contextmanager
def recording_pdl():
    """Launches in the block take PDL's options as on sm_90 and later; for launch recorders that
    do not run the kernels (Triton's interpreter has no griddepcontrol)."""
    global _pdl_recording
    previous, _pdl_recording = _pdl_recording, True
    try:
        yield
    finally:
        _pdl_recording = previous


LAUNCH_STAGES = 3

# The register ceiling (`maxnreg`) of the kernels whose grid is at most about one program per SM at
# batch 1 (decode attention, routing, head norms). Without one, ptxas may cap a kernel's registers
# for occupancy and spill a few bytes instead (40 registers and 8 bytes of spill for the attention's
# combine on sm_120, 128 and 8 bytes for its split kernel on sm_90: launch_log.record_compiles shows
# it); occupancy buys such a grid nothing, a spill costs local-memory traffic.
MAX_REGISTERS = 255


@dataclass(frozen=True)
class CompileSpec:
    """One specialization of a Triton kernel, as the engine launches it for the real model.

    signature: every argument of the jitted function by name -> Triton type ("*bf16", "*fp8e4nv",
    "*i32", "*fp32", "i32", "fp32", "constexpr"); constexprs: values of the constexpr arguments;
    attrs: what Triton's JIT adds by argument, [["tt.divisibility", 16]] for a 16-byte aligned pointer
    or an integer divisible by 16 (it lets the compiler vectorize and pipeline loads, which changes
    registers and shared memory: launch_log.record_compiles takes them from the JIT itself);
    maxnreg: the launch's register ceiling, where one is passed. Without attrs kernels.check
    marks what the JIT marks at the real shapes (check.jit_attrs).
    """

    name: str
    fn: object
    signature: dict[str, str]
    constexprs: dict[str, object] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = LAUNCH_STAGES
    attrs: dict[str, list] = field(default_factory=dict)
    maxnreg: int | None = None

    def __post_init__(self):
        # PDL is the arch's to set (kernels.check compiles it on for sm_90 and later), never a spec's
        object.__setattr__(self, "signature", {k: v for k, v in self.signature.items() if k != "PDL"})
        object.__setattr__(self, "constexprs", {k: v for k, v in self.constexprs.items() if k != "PDL"})


def spec_key(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int, maxnreg: int | None) -> tuple:
    """What makes one compiled specialization: the function, argument types, constexpr values
    (defaults filled in) and launch options. A launch and a compile spec match when their keys do.
    PDL is left out: the arch decides it (kernels.check compiles it on where the card has it), and
    it adds two instructions at a kernel's entry, nothing to its loop."""
    fn = getattr(fn, "fn", fn)  # the Python function under a JITFunction or InterpretedFunction
    values = {
        name: param.default
        for name, param in inspect.signature(fn).parameters.items()
        if param.default is not inspect.Parameter.empty
    } | constexprs
    values.pop("PDL", None)
    types = {name: kind for name, kind in signature.items() if kind != "constexpr"}
    return (
        fn.__module__,
        fn.__name__,
        tuple(sorted(types.items())),
        tuple(sorted((name, repr(value)) for name, value in values.items())),
        num_warps,
        num_stages,
        maxnreg,
    )
