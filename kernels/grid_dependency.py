"""Programmatic dependent launch (PDL), the kernel's half: on sm_90 and later a kernel launched
with PDL's option may start while the kernel before it in the stream still runs, so its launch and
block scheduling overlap that kernel's tail instead of following it (CUDA programming guide,
"Programmatic Dependent Launch and Synchronization").

Every FlashDesk kernel calls `enter(PDL)` first. With PDL on, a program waits there until the
kernels before it have completed and their writes are visible (griddepcontrol.wait), before it
reads or writes anything, so results and their order are those of plain stream order: only launch
latency overlaps. It then lets the next kernel launch (griddepcontrol.launch_dependents); that one
waits in turn. PDL is a constexpr because the instructions exist only on sm_90 and later (and not
in Triton's interpreter): backend.pdl_options decides it per device, kernels.check per arch.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def enter(PDL: tl.constexpr):
    """The first statement of every kernel: wait for the kernels before, then release the next."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
