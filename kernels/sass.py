"""Read a compiled kernel's SASS (from the triton wheel's `cuobjdump -sass`): its main loop.

At batch 1 a kernel streams weights or KV, and two things decide whether it streams at the card's
speed: the bytes its loads keep in flight and the instructions it issues per byte. Both are in the
SASS. The main loop is the innermost backward branch whose body issues the most global-load bytes
(a kernel with no loop is its whole body, once). Its instructions are counted per warp, as a scheduler
issues them; its load bytes are each load's width times the 32 lanes of a warp (a predicated load
counts whole: an upper bound), and whether they are asynchronous copies (cp.async, `LDGSTS`, or
TMA, `UTMALDG`): those are what Triton's software pipeliner keeps `num_stages - 1` iterations ahead.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")
_WIDTH = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}
ASYNC_LOADS = ("LDGSTS", "UTMALDG")
LANES = 32


@dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str  # with modifiers, e.g. "LDG.E.128"
    operands: str


@dataclass(frozen=True)
class Loop:
    """The main loop of a kernel, per warp: instructions and global-load bytes of one pass."""

    instructions: int
    load_bytes: int  # per warp: sum of load widths x 32 lanes
    async_copies: bool  # its loads are cp.async / TMA (pipelined by num_stages)
    is_loop: bool  # False: the kernel has no loop with loads, this is its whole body


def parse(sass: str) -> list[Instruction]:
    """The instructions of `cuobjdump -sass` output (one kernel), in address order."""
    out = []
    for match in _LINE.finditer(sass):
        address, _, opcode, operands = match.groups()
        out.append(Instruction(int(address, 16), opcode, operands.strip()))
    if not out:
        raise ValueError("no SASS instruction found (is this cuobjdump -sass output?)")
    return out


def load_width(opcode: str) -> int:
    """Bytes per lane of a global load (LDG, LDGSTS; TMA counts as 0 here: its box is not in SASS),
    0 for anything else."""
    parts = opcode.split(".")
    if parts[0] not in ("LDG", "LDGSTS"):
        return 0
    for modifier in reversed(parts[1:]):
        if modifier in _WIDTH:
            return _WIDTH[modifier]
    return 4


def _loops(code: list[Instruction]) -> list[tuple[int, int]]:
    """(first, last) indices of every backward branch's body."""
    index = {ins.address: i for i, ins in enumerate(code)}
    loops = []
    for i, ins in enumerate(code):
        if ins.opcode.split(".")[0] != "BRA":
            continue
        target = _BRANCH_TARGET.search(ins.operands)
        if target and int(target.group(1), 16) < ins.address and int(target.group(1), 16) in index:
            loops.append((index[int(target.group(1), 16)], i))
    return loops


def _summary(body: list[Instruction], is_loop: bool) -> Loop:
    loads = [ins for ins in body if load_width(ins.opcode) or ins.opcode.startswith(ASYNC_LOADS)]
    return Loop(
        instructions=len(body),
        load_bytes=sum(load_width(ins.opcode) * LANES for ins in loads),
        async_copies=any(ins.opcode.startswith(ASYNC_LOADS) for ins in loads),
        is_loop=is_loop,
    )


def _innermost(loops: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The loops that hold no other loop (an outer loop's body also holds the inner one's prologue)."""
    return [(f, l) for f, l in loops if not any(f <= g and m <= l and (g, m) != (f, l) for g, m in loops)]


def _table_walk(body: list[Instruction]) -> bool:
    """Whether every global load of a loop reads through the read-only constant path: a table
    walked by a slow path (libdevice's cos and sin reduce a large angle so), not streamed data."""
    loads = [ins for ins in body if ins.opcode.startswith("LDG")]
    return bool(loads) and all(".CONSTANT" in ins.opcode for ins in loads)


def main_loop(sass: str) -> Loop:
    """The innermost loop that streams: one with asynchronous copies (what the software pipeliner
    makes of a kernel's main loop) before one without (an epilogue's, such as a split sum or an
    attention combine), then the one that loads the most bytes (ties: the longer one); the whole
    kernel if none loads. A loop that only walks a constant table (`_table_walk`) does not count."""
    code = parse(sass)
    best = None
    for first, last in _innermost(_loops(code)):
        if _table_walk(code[first : last + 1]):
            continue
        loop = _summary(code[first : last + 1], True)
        rank = (loop.async_copies, loop.load_bytes, loop.instructions)
        if loop.load_bytes and (best is None or rank > (best.async_copies, best.load_bytes, best.instructions)):
            best = loop
    if best is not None:
        return best
    body = [ins for ins in code if not (ins.opcode == "BRA" and ins is code[-1])]  # the trailing self-branch
    return _summary(body, False)


def disassemble(cubin: bytes, cuobjdump: str) -> str:
    """`cuobjdump -sass` of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        return subprocess.run([cuobjdump, "-sass", file.name], check=True, capture_output=True, text=True).stdout
