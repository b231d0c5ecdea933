"""MTP drafts with Gemma 4's assistant: the state a generation keeps between rounds and one
round's drafts, as transformers' SinglePositionMultiTokenCandidateGenerator and assisted decoding
run them (the decode loop, speculative.py, verifies them as it verifies DFlash's).

A round:
- the assistant drafts K tokens one step at a time from one query position (the sequence's length
  minus one), starting from the last emitted token and the target's final-normed hidden state of
  the row that emitted it (the prompt's last row after the prefill);
- it attends over the K/V the target's last forward returned for its last layer of each kind, cut
  to the sequence's length: for a full layer every position up to the sequence's end (after a
  rejection that includes the rejected draft's K/V at the bonus token's position), for a sliding
  layer the window the forward saw (the `window - 1` before the block and the block itself, rejected
  drafts included; after a prefill, the whole prompt), of which the assistant's mask keeps the last
  `window + 1`;
- the target verifies [last token, drafts] in one forward.

The assistant reads those keys where the cache holds them (KVCache.attend_span: in place on the
Triton path, fp8 included). Nothing here reads the device or waits for it: the drafted tokens
stay device tensors until the step's one read, and positions come from the cache's device copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flashdesk.engine.decode.sampling import SamplingParams, draw, probabilities
from flashdesk.engine.model.assistant import Assistant
from flashdesk.engine.model.config import FULL
from flashdesk.engine.model.gemma4 import Gemma4
from flashdesk.engine.model.kv_cache import KVCache

MTP_MAX_DRAFT = 15  # the rings' slack (16) holds a verify block of up to 16 rows
# each draft token costs one assistant step, and a long draft is rarely all accepted: a moderate
# default until the automatic length or the user's own bench says better for this card
MTP_DEFAULT_DRAFT = 4


@dataclass(frozen=True)
class Seen:
    """The positions the target's last forward ran: [start, end)."""

    start: int
    end: int


@dataclass(frozen=True)
class RoundState:
    """What the next round drafts from: the target's hidden state [1, D] of the row that emitted
    the last token, and what its last forward ran."""

    hidden: torch.Tensor
    seen: Seen


def _last_layer(model: Gemma4, kind: str) -> int:
    return max(i for i, spec in enumerate(model.cfg.layers) if spec.kind == kind)


def shared_spans(model: Gemma4, seen: Seen, length: int) -> dict[str, tuple[int, int, int]]:
    """{kind: (layer, lo, hi)}: the target's K/V the assistant attends over for a sequence of
    `length` tokens after a forward over `seen`, positions lo..hi-1 of its last layer of that kind
    (see the module's docstring)."""
    out = {}
    for kind in {spec.kind for spec in model.cfg.layers}:
        layer = _last_layer(model, kind)
        if kind == FULL:
            lo, hi = 0, min(seen.end, length)
        else:
            window = model.cfg.sliding_window
            lo = max(0, seen.start - (window - 1))  # what the forward returned, cut to `length` entries
            hi = min(seen.end, lo + length)
        out[kind] = (layer, lo, hi)
    return out


class MtpDrafter:
    """The assistant beside its target: drafts of up to `max_draft_length` tokens a round."""

    method = "mtp"

    def __init__(self, target: Gemma4, assistant: Assistant):
        self.target, self.assistant = target, assistant
        self.max_draft_length = MTP_MAX_DRAFT
        self.default_draft_length = MTP_DEFAULT_DRAFT
        self.state: RoundState | None = None

    def after_prefill(self, hidden: torch.Tensor, length: int) -> None:
        """The prompt of `length` tokens ran; hidden [1, D] is its last row's (the reference runs
        the prompt in one forward: its sliding K/V is the whole prompt, whatever our chunks were)."""
        self.state = RoundState(hidden, Seen(0, length))

    def after_forward(self, hidden: torch.Tensor, start: int, rows: int) -> None:
        """A target forward of `rows` rows from `start` ran; hidden [1, D] is the row that emitted
        its last kept token (picked on the device)."""
        self.state = RoundState(hidden, Seen(start, start + rows))

    def draft(
        self,
        cache: KVCache,
        last: torch.Tensor,
        k: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        guide=None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """k drafts after last [1] (not yet run through the target, at position cache.length): the
        drafted ids [k] and, when sampling, the distributions they were drawn from [k, V]. `guide`: a
        grammar's walk (grammar.Walk), which masks each step's logits and follows its token."""
        if self.state is None:
            raise RuntimeError("an MTP round needs the prefill's hidden state first")
        length = cache.length + 1  # the sequence, the last token included
        spans = shared_spans(self.target, self.state.seen, length)

        def attend(kind: str, q: torch.Tensor) -> torch.Tensor:  # over the cache, in place where it can
            layer, lo, hi = spans[kind]
            return cache.attend_span(layer, q, lo, hi, self.assistant.keys_seen(kind))

        hidden, token = self.state.hidden, last.view(1)
        ids, probs = [], []
        for _ in range(k):
            embedding = F.embedding(token, self.target.embed) * self.target.embed_scale
            # the query's position, length - 1, is the cache's length: read where the device holds it
            logits, hidden = self.assistant.step(embedding, hidden, attend, cache.position)
            if guide is not None:
                logits = guide.masked(logits)
            if sampling.greedy:
                token = logits.argmax(dim=-1)
            else:
                p = probabilities(logits, sampling)
                token = draw(p, generator)
                probs.append(p)
            if guide is not None:
                guide.take(token)
            ids.append(token)
        return torch.cat(ids), torch.cat(probs) if probs else None
