"""Compile a block's Triton kernels in parallel, before anything needs them.

Triton compiles a kernel when it is first launched with a new specialization, one after another on
the launching thread: a generation's 42 specializations (real shapes, sm_90) took 19 s on one core
here, before the first token on a fresh machine. Inside `compile_ahead()` a launch compiles instead
of running, on a pool of threads (Triton's AsyncCompileMode; ptxas and most of the MLIR and LLVM
passes let go of the GIL: the same 42 took 11 s on two threads), and leaving the block waits for
them all. The launches that follow find every kernel compiled, and Triton's disk cache keeps them
for the next process.

No kernel runs inside the block, so whatever they would have written holds garbage: run only blocks
whose host side reads no kernel result, on state set back afterwards (engine/decode/kernel_warmup).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from flashdesk.kernels.backend import interpreted, use_triton


def _async_mode():
    """Triton's AsyncCompileMode class, or None where this Triton has none or runs interpreted."""
    if interpreted():
        return None
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return None
    return AsyncCompileMode


def where_compiled(device) -> str:
    """In words, for `doctor`: when this device's kernels compile, and where they are kept."""
    if not use_triton(device):
        return "nothing to compile: the torch kernels run"
    if interpreted():
        return "nothing to compile: Triton's interpreter runs the kernels"
    try:
        from triton import knobs

        folder = knobs.cache.dir
    except (ImportError, AttributeError):  # an older Triton: its default
        folder = os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache"))
    kept = f"kept in {folder} for later loads"
    if _async_mode() is None:
        return f"one by one at first use (this Triton has no async compile mode); {kept}"
    return f"at load, on {os.cpu_count()} threads at once; {kept}"


@contextmanager
def compile_ahead(workers: int | None = None):
    """Yield True when the block's Triton launches compile on `workers` threads (default: every
    core) instead of running; on leaving, all are compiled or the first compile error is raised.
    Yield False where that cannot be done (the interpreter, a Triton without AsyncCompileMode):
    then launches run as usual, so the caller skips its block."""
    mode = _async_mode()
    if mode is None:
        yield False
        return
    from triton.runtime.jit import JITFunction

    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        return launch(self, *args, grid=grid, warmup=True, **kwargs)

    with ThreadPoolExecutor(workers or os.cpu_count() or 1, thread_name_prefix="triton-compile") as pool:
        with mode(pool):
            JITFunction.run = compile_only
            try:
                yield True
            finally:
                JITFunction.run = launch
