"""The automatic draft length: each step drafts the K that maximizes expected tokens per second.

A step with K drafts emits 1 + (accepted drafts) tokens and costs a draft of K plus a verify of
K + 1 rows; a plain step emits 1 token for a verify of one row. With p_i the chance that draft i
is accepted once drafts 1..i-1 were, a step with K drafts emits on average

    E(K) = 1 + sum_{i=1..K} p_1 p_2 ... p_i

so the best K maximizes E(K) / (draft(K) + verify(K + 1)), and K = 0 (a plain step) wins when
acceptance is too low to pay for the draft. The costs are measured on this card: once at first
use (`calibrate`, a few timed passes of every length, kept per card and model by the caller),
then refined by every step's own measured times. The p_i are decayed averages of what the live
acceptance was at each position, so they follow the text (code accepts long runs, chat short
ones); a position seldom reached borrows from the one before it, so a long draft is tried again
when the short ones do well. A plain step sees no acceptance, so it only forgets: the rates drift
back to the prior and drafting is tried again after a while (else a few early misses would stop
speculation for good, though the text may have turned into code since).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

DECAY = 0.95  # each step's weight against the history: about the last twenty steps at a position
PRIOR_ACCEPTANCE = 0.7  # the first position's acceptance before anything was seen
BORROW = 1.0  # pseudo-observations a position takes from the one before it
COST_SMOOTHING = 0.8  # a measured step cost's weight is 1 - this


@dataclass
class StepCosts:
    """Seconds of a draft of k tokens (index k) and of a target pass over m rows (index m)."""

    draft: list[float]
    verify: list[float]

    def step(self, k: int) -> float:
        return self.verify[1] if k == 0 else self.draft[k] + self.verify[k + 1]

    def to_json(self) -> dict:
        return {"draft": self.draft, "verify": self.verify}

    @classmethod
    def from_json(cls, data: dict, max_k: int) -> "StepCosts | None":
        """Costs read back from the cache, or None when they do not fit this drafter."""
        try:
            draft, verify = [float(x) for x in data["draft"]], [float(x) for x in data["verify"]]
        except (KeyError, TypeError, ValueError):
            return None
        if len(draft) != max_k + 1 or len(verify) != max_k + 2 or min(draft[1:] + verify[1:]) <= 0:
            return None
        return cls(draft, verify)


@dataclass
class AutoDraftLength:
    """Chooses each step's draft length from the step costs and the live acceptance by position."""

    max_k: int
    costs: StepCosts | None = None
    successes: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.successes = self.successes or [0.0] * (self.max_k + 1)
        self.trials = self.trials or [0.0] * (self.max_k + 1)

    def acceptance(self) -> list[float]:
        """p_i for i = 1..max_k (index 0 unused): each position's decayed rate, shrunk toward
        the position before it by BORROW pseudo-observations."""
        p, before = [1.0], PRIOR_ACCEPTANCE
        for i in range(1, self.max_k + 1):
            before = (self.successes[i] + BORROW * before) / (self.trials[i] + BORROW)
            p.append(before)
        return p

    def expected_tokens(self, k: int) -> float:
        p, run, total = self.acceptance(), 1.0, 1.0
        for i in range(1, k + 1):
            run *= p[i]
            total += run
        return total

    def rate(self, k: int) -> float:
        """Expected tokens per second of a step with k drafts."""
        if self.costs is None:
            raise RuntimeError("the automatic draft length needs step costs: calibrate first")
        return self.expected_tokens(k) / self.costs.step(k)

    def choose(self, limit: int) -> int:
        """The draft length (0: a plain step) with the most expected tokens per second, at most
        `limit` (the tokens still wanted, and the drafter's block)."""
        if self.costs is None:
            raise RuntimeError("the automatic draft length needs step costs: calibrate first")
        top = max(0, min(limit, self.max_k))
        return max(range(top + 1), key=lambda k: (self.rate(k), -k))

    def forget(self) -> None:
        """Decay the acceptance toward the prior: a step without evidence (a plain step, or another
        method's), so that this length or method is tried again after a while."""
        self.successes = [DECAY * s for s in self.successes]
        self.trials = [DECAY * t for t in self.trials]

    def observe(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """Fold in one step: drafts 1..accepted were accepted, draft accepted + 1 (if any) was not;
        its measured times refine the costs of its length."""
        if k == 0:  # no evidence: forget a little, so that drafting is retried
            self.forget()
        for i in range(1, min(accepted + 1, k) + 1):
            self.successes[i] = DECAY * self.successes[i] + (1.0 if i <= accepted else 0.0)
            self.trials[i] = DECAY * self.trials[i] + 1.0
        if self.costs is not None and verify_seconds > 0:
            a = COST_SMOOTHING
            self.costs.verify[k + 1] = a * self.costs.verify[k + 1] + (1 - a) * verify_seconds
            if k > 0 and draft_seconds > 0:
                self.costs.draft[k] = a * self.costs.draft[k] + (1 - a) * draft_seconds


def costs_file(folder: Path, *key: str) -> Path:
    """Where the measured step costs of one (card, model, drafter, dtypes, kernels) are kept."""
    digest = hashlib.sha256("\n".join(key).encode()).hexdigest()[:20]
    return folder / f"{digest}.json"


def load_costs(path: Path, max_k: int) -> StepCosts | None:
    """Costs measured earlier on this card, or None (none yet, unreadable, or another drafter)."""
    try:
        return StepCosts.from_json(json.loads(path.read_text(encoding="utf-8")), max_k)
    except (OSError, ValueError, AttributeError):
        return None


def save_costs(path: Path, costs: StepCosts) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(costs.to_json()), encoding="utf-8")
    except OSError:
        pass  # a cache: the next first use measures again
