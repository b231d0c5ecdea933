"""Prefix reuse across requests: keep what earlier turns computed and prefill only what is new.

The engine has one KV cache and one drafter context on the device. After a request they hold the
conversation so far (its prompt and its reply, but the last token). The next request is matched
against it by token ids, and only the rest is prefilled.

Full-attention layers are indexed by position, so any prefix of them stays usable. The sliding
layers are rings of window + slack slots: once a reply runs past the slack, the window before the
prompt's end is overwritten. Gemma 4's template drops earlier thoughts, so the next prompt usually
diverges right where the last reply began. Therefore a copy of the rings (`Snapshot`, host memory)
is kept at the end of every prompt; restoring it and rolling back a few positions resumes there.

Switching conversations: when a request matches a conversation kept in host memory better than
the one on the device, the device one is copied out (its full layers up to its length, its rings)
and the other copied in. Kept conversations and snapshots share a host memory budget; the least
recently used go first.

Scopes: every request names the scope it belongs to (the API server passes one per API key; the
app and the command line have their own), and a request only ever resumes conversations of its own
scope. Reuse is visible (fewer prefill tokens, `cached_tokens`, a faster first token), so a client
that could reuse another's prefix could learn how that one's prompt begins.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import torch

from flashdesk.engine.model.drafter import DraftContext
from flashdesk.engine.model.kv_cache import KVCache, ring_keeps

LOCAL = ""  # the scope of this machine's own requests (the app, the command line)
MAX_SNAPSHOTS = 4  # per conversation: the last prompts' ends (regenerate, follow-up, edit the last message)
DEFAULT_BUDGET = 4 << 30  # host bytes for kept conversations and snapshots (FLASHDESK_PREFIX_CACHE_MB)


def default_budget() -> int:
    explicit = os.environ.get("FLASHDESK_PREFIX_CACHE_MB")
    if explicit:
        return max(0, int(explicit)) << 20
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return DEFAULT_BUDGET
    return min(DEFAULT_BUDGET, total // 4)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _host_copy(buffers: list[tuple[torch.Tensor, bool]], length: int, rings_only: bool) -> list[torch.Tensor | None]:
    """Host copies of the rings (whole) and, unless rings_only, of the full layers' first `length`."""
    out: list[torch.Tensor | None] = []
    for tensor, ring in buffers:
        if ring:
            out.append(tensor.to("cpu", copy=True))
        else:
            out.append(None if rings_only else tensor[:length].to("cpu", copy=True))
    return out


def _restore(buffers: list[tuple[torch.Tensor, bool]], copies: list[torch.Tensor | None]) -> None:
    for (tensor, _), copy in zip(buffers, copies):
        if copy is not None:
            tensor[: copy.shape[0]].copy_(copy)


def _nbytes(copies) -> int:
    return sum(t.numel() * t.element_size() for t in copies if t is not None)


@dataclass(eq=False)  # compared by identity: its fields hold tensors
class Snapshot:
    """The rings of the target cache and the drafter context where a prompt ended."""

    position: int
    high: tuple[int, int]  # the cache's and the context's high-water marks then
    target: list
    draft: list
    valid: int  # leading positions whose tokens are the sequence's (a later turn may diverge sooner)

    def nbytes(self) -> int:
        return _nbytes(self.target) + _nbytes(self.draft)


@dataclass(eq=False)  # by identity (kept.remove takes the very one resumed): its snapshots hold tensors
class Sequence:
    """One conversation's state: `tokens` are the ids at positions 0..len-1. `kept` holds host copies
    of its buffers while it is not the one on the device."""

    tokens: list[int]
    high: tuple[int, int]
    snapshots: list[Snapshot] = field(default_factory=list)
    kept: tuple[list, list] | None = None
    scope: str = LOCAL  # whose conversation it is: only requests of the same scope resume it

    def nbytes(self) -> int:
        kept = _nbytes(self.kept[0]) + _nbytes(self.kept[1]) if self.kept else 0
        return kept + sum(s.nbytes() for s in self.snapshots)


@dataclass(frozen=True)
class Resume:
    """Where a request can start in a sequence: position `start`, through `snapshot` or live."""

    start: int
    snapshot: Snapshot | None


class PrefixCache:
    """The device cache's current sequence plus conversations kept in host memory."""

    def __init__(self, cache: KVCache, ctx: DraftContext | None, budget: int | None = None):
        self.cache, self.ctx = cache, ctx
        self.budget = default_budget() if budget is None else budget
        self.active: Sequence | None = None  # what the device buffers hold; None: unknown
        self.running: Sequence | None = None  # the request in flight: its prompt and snapshots
        self.kept: list[Sequence] = []  # least recently used first

    # -- matching ---------------------------------------------------------------------------------

    def _rings_keep(self, at: int, high: tuple[int, int]) -> bool:
        """Whether rings written up to `high` still hold the window a query at `at` needs."""
        if not all(ring_keeps(at, high[0], s.capacity, s.layout.window) for s in self.cache.layers):
            return False
        return self.ctx is None or all(
            ring_keeps(at, high[1], cap, self.ctx.window(i)) for i, cap in enumerate(self.ctx.capacity)
        )

    def _resume(self, seq: Sequence, prompt: list[int]) -> Resume:
        """The furthest start in `seq` for `prompt`: its live end or a snapshot, rolled back to the
        common prefix (ring validity only grows with the start, so each place has one candidate).
        The prompt's last token is always run: its logits give the reply's first token."""
        common = min(common_prefix(seq.tokens, prompt), len(prompt) - 1)
        best = Resume(0, None)
        if self._rings_keep(common, seq.high):
            best = Resume(common, None)
        for snap in seq.snapshots:
            at = min(common, snap.valid)
            if at > best.start and self._rings_keep(at, snap.high):
                best = Resume(at, snap)
        return best

    def _room(self) -> int:
        """How far back from a ring's high-water mark a sequence can always be rolled."""
        return max(self.cache.slack, self.ctx.slack if self.ctx else 0) + 1

    def _candidates(self, scope: str) -> list[Sequence]:
        """The sequences a request of `scope` may resume, the device's first."""
        return [seq for seq in ([self.active] if self.active else []) + self.kept[::-1] if seq.scope == scope]

    def reusable(self, prompt: list[int], scope: str = LOCAL) -> int:
        """How many of the prompt's tokens a request of `scope` would take from the cache (computes nothing)."""
        return max((self._resume(seq, prompt).start for seq in self._candidates(scope)), default=0)

    # -- a request's life ---------------------------------------------------------------------------

    def start(self, prompt: list[int], reuse: bool = True, scope: str = LOCAL) -> int:
        """Put the device buffers at the longest prefix of `prompt` reusable in `scope`; return its
        length. Until `finish`, the device state belongs to the running request."""
        best_seq, best = None, Resume(0, None)
        for seq in self._candidates(scope) if reuse else []:
            found = self._resume(seq, prompt)
            if found.start > best.start:
                best_seq, best = seq, found
        active, self.active = self.active, None
        if reuse and active is not None and (best_seq is not active or self._branches(active, best)):
            self._keep(active)  # another conversation, or a branch off an earlier turn
        if best_seq is None:
            self.cache.reset()
            if self.ctx is not None:
                self.ctx.reset()
        else:
            if best_seq is not active:
                self.kept.remove(best_seq)
                self._load(best_seq)
            if best.snapshot is not None:
                self._place(best.snapshot.position, best.snapshot.high, best.snapshot.target, best.snapshot.draft)
            self.cache.rollback(best.start)
            if self.ctx is not None:
                self.ctx.rollback(best.start)
        older = [replace(s, valid=min(s.valid, best.start)) for s in (best_seq.snapshots if best_seq else [])]
        older = [s for s in older if s.valid and self._rings_keep(s.valid, s.high)]  # still a way back
        self.running = Sequence(list(prompt[: best.start]), (0, 0), older, scope=scope)
        self._fit_budget()
        return best.start

    def _branches(self, seq: Sequence, at: Resume) -> bool:
        """A request that resumes before the sequence's last prompt end leaves a turn behind."""
        last = seq.snapshots[-1].position if seq.snapshots else len(seq.tokens)
        return at.start + self._room() < last

    def mark_prompt_end(self, prompt: list[int]) -> None:
        """The prompt has been prefilled: keep a copy of the rings here (host memory)."""
        if self.budget <= 0 or self.running is None:
            return
        snap = Snapshot(
            self.cache.length,
            self._highs(),
            _host_copy(self.cache.buffers(), 0, rings_only=True),
            _host_copy(self.ctx.buffers(), 0, rings_only=True) if self.ctx else [],
            self.cache.length,
        )
        snapshots = (self.running.snapshots + [snap])[-MAX_SNAPSHOTS:]
        self.running = Sequence(list(prompt), (0, 0), snapshots, scope=self.running.scope)
        self._fit_budget()

    def finish(self, tokens: list[int] | None) -> None:
        """The request is over: the device buffers hold `tokens` (None: unknown, after a failure)."""
        running, self.running = self.running, None
        if not (
            tokens is not None
            and self.cache.length == len(tokens)
            and (self.ctx is None or self.ctx.length == len(tokens))
        ):  # not what the buffers hold: unknown
            self.active = None
            return
        snaps = [s for s in (running.snapshots if running else []) if s.valid <= len(tokens)]
        self.active = Sequence(list(tokens), self._highs(), snaps, scope=running.scope if running else LOCAL)
        self._fit_budget()

    # -- host copies ----------------------------------------------------------------------------------

    def _highs(self) -> tuple[int, int]:
        return self.cache.high, self.ctx.high if self.ctx else 0

    def _place(self, length: int, high: tuple[int, int], target: list, draft: list) -> None:
        _restore(self.cache.buffers(), target)
        self.cache.place(length, high[0])
        if self.ctx is not None:
            _restore(self.ctx.buffers(), draft)
            self.ctx.place(length, high[1])

    def _keep(self, seq: Sequence) -> None:
        if self.budget <= 0 or not seq.tokens:
            return
        n = len(seq.tokens)
        seq.kept = (
            _host_copy(self.cache.buffers(), n, rings_only=False),
            _host_copy(self.ctx.buffers(), n, rings_only=False) if self.ctx else [],
        )
        self.kept.append(seq)

    def _load(self, seq: Sequence) -> None:
        assert seq.kept is not None  # a sequence in self.kept has its host copies (_keep)
        self._place(len(seq.tokens), seq.high, *seq.kept)
        seq.kept = None

    def host_bytes(self) -> int:
        return sum(s.nbytes() for s in self.kept + [x for x in (self.active, self.running) if x is not None])

    def _fit_budget(self) -> None:
        """Drop the least recently used kept conversations, then the oldest snapshots, until the
        host copies fit the budget."""
        while self.kept and self.host_bytes() > self.budget:
            self.kept.pop(0)
        for seq in (self.active, self.running):
            while seq is not None and seq.snapshots and self.host_bytes() > self.budget:
                seq.snapshots.pop(0)
