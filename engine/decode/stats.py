"""Per-step records of the decode loop -> the speculative-decoding statistics the app and `bench` show.

Why per-step records: every figure (tok/s, acceptance rate, mean acceptance length, per-position
acceptance, the histogram of accepted lengths) is a sum over steps, so the decode loop only has to
say what each step drafted, accepted and emitted, and how long it took. `SpecStats` keeps running
sums so the app can show the numbers live without keeping or rescanning the whole history.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable


@dataclass(frozen=True)
class StepRecord:
    """What one decode step did.

    A step without speculation has an empty draft, accepted 0, and emits the one token of a plain
    decode step, whose time is `verify_seconds`. `emitted` may be shorter than `accepted + 1` when
    EOS or the token budget cut the step short.
    """

    draft: tuple[int, ...]  # the drafted ids (empty when speculation was off for that step)
    accepted: int  # how many of them were accepted (a prefix)
    emitted: tuple[int, ...]  # ids appended by the step (accepted drafts + the target's token)
    draft_seconds: float
    verify_seconds: float  # for a step without speculation: the time of the plain decode step
    method: str | None = None  # the draft model that drafted: "dflash", "mtp" (None: unnamed or plain)

    def __post_init__(self):
        # tuples whatever the caller passed, so a record cannot change after it was counted
        object.__setattr__(self, "draft", tuple(self.draft))
        object.__setattr__(self, "emitted", tuple(self.emitted))
        if not 0 <= self.accepted <= len(self.draft):
            raise ValueError(f"accepted={self.accepted} is outside 0..{len(self.draft)} (the draft length)")
        if len(self.emitted) > self.accepted + 1:
            raise ValueError(
                f"{len(self.emitted)} ids emitted, but a step emits at most accepted + 1 = {self.accepted + 1}"
            )
        if self.draft_seconds < 0 or self.verify_seconds < 0:
            raise ValueError("step times cannot be negative")

    @property
    def speculative(self) -> bool:
        return bool(self.draft)


class SpecStats:
    """Running sums over steps; `summary()` at any time gives the statistics so far."""

    def __init__(self) -> None:
        self.steps = 0
        self.decode_tokens = 0
        self.draft_seconds = 0.0
        self.verify_seconds = 0.0
        self.speculative_steps = 0
        self.drafted = 0
        self.accepted = 0
        self.speculative_emitted = 0
        self._offered: list[int] = []  # [i]: speculative steps whose draft had a position i
        self._taken: list[int] = []  # [i]: of those, the steps that accepted position i
        self._histogram: list[int] = []  # [a]: speculative steps that accepted exactly a drafts
        self.by_method: dict[str, SpecStats] = {}  # each named method's own steps

    def add(self, step: StepRecord) -> None:
        if step.method is not None and step.speculative:
            self.by_method.setdefault(step.method, SpecStats()).add(replace(step, method=None))
        self.steps += 1
        self.decode_tokens += len(step.emitted)
        self.draft_seconds += step.draft_seconds
        self.verify_seconds += step.verify_seconds
        if not step.speculative:
            return
        k = len(step.draft)
        self.speculative_steps += 1
        self.drafted += k
        self.accepted += step.accepted
        self.speculative_emitted += len(step.emitted)
        if k > len(self._offered):  # a longer draft than any before: the lists grow to it
            self._offered += [0] * (k - len(self._offered))
            self._taken += [0] * (k - len(self._taken))
            self._histogram += [0] * (k + 1 - len(self._histogram))
        for i in range(k):
            self._offered[i] += 1
            if i < step.accepted:
                self._taken[i] += 1
        self._histogram[step.accepted] += 1

    def summary(self) -> dict:
        """The statistics so far; ratios are None (not 0) when nothing was drafted, so the app can say n/a.

        `per_position_acceptance` and `accepted_histogram` are empty lists before the first
        speculative step; after it they run to the longest draft seen (histogram: one longer, for 0).
        """
        seconds = self.draft_seconds + self.verify_seconds
        spec = self.speculative_steps
        return {
            "steps": self.steps,
            "decode_tokens": self.decode_tokens,
            "decode_seconds": seconds,
            "decode_tokens_per_second": self.decode_tokens / seconds if seconds > 0 else 0.0,
            "speculative_steps": spec,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "speculative_emitted": self.speculative_emitted,
            "mean_acceptance_length": self.speculative_emitted / spec if spec else None,
            "per_position_acceptance": [t / n for t, n in zip(self._taken, self._offered)],
            "accepted_histogram": list(self._histogram),
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            # per method, over its own steps (a method's tok/s: what its steps emitted in their time)
            "by_method": {name: stats.summary() for name, stats in self.by_method.items()},
        }


def summarize(steps: Iterable[StepRecord]) -> dict:
    """`SpecStats` over all steps at once (bench, the end of a message)."""
    stats = SpecStats()
    for step in steps:
        stats.add(step)
    return stats.summary()
