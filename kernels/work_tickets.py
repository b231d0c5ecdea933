"""Ordered work items inside one launch: a program takes a ticket, and the ticket, not the program
id, names its item. Two stages that would be two launches (an expert's gate/up rows, then its down
rows) become one, the second's items waiting on counters for the first's.

Why tickets: the GPU gives no guarantee on which programs are resident or in what order they
start. If item i were program i, an item that waits could occupy every SM while the items it
waits for had not started: a deadlock. A ticket is taken by a program already running, so every
item with a smaller ticket is held by a program that is running or done; an item waits only for
smaller tickets whose items wait for nothing of theirs that is larger, so every wait ends. Under
Triton's interpreter the programs run one after another in id order, tickets follow that order,
and every wait is already met when it starts.

Memory order: a producer's threads store, meet at a barrier, and one of them counts in with a
release; a consumer's acquire of the count then sees those stores (the CUDA memory model's
release/acquire pattern at device scope). Consumers load what they wait for past L1 (.cg) too.
The counters live in `backend.arrival_counters`: zero between launches, and the launch's last
item puts them back to zero.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def take(counter):
    """This program's ticket: 0, 1, 2, ... in the order programs reach it (after `enter`)."""
    return tl.atomic_add(counter, 1, sem="relaxed")


@triton.jit
def count_in(counter):
    """Publish this program's stores (every thread's) and add one to `counter`; returns the count
    before (the last of n programs sees n - 1)."""
    tl.debug_barrier()
    return tl.atomic_add(counter, 1, sem="acq_rel")


@triton.jit
def wait_count(counter, target):
    """Spin until `counter` reaches `target`; what the counted programs stored is then visible.
    An atomic add of 0 with acquire compiles to an acquire load (ld.global.gpu.acquire), one
    thread's, shared with the others through shared memory and a barrier each pass."""
    while tl.atomic_add(counter, 0, sem="acquire") < target:
        pass
