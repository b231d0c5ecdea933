"""MTP rounds with Gemma 4's assistant, greedy, on the torch path: the reference-shaped loop that the
engine's decode loop will run (it is not wired into `Engine.generate` yet).

A round, as transformers' SinglePositionMultiTokenCandidateGenerator and assisted decoding run it:
- the assistant drafts K tokens one step at a time from one query position (the sequence's length
  minus one), starting from the last emitted token and the target's final-normed hidden state of
  the row that emitted it (the prompt's last row after the prefill);
- it attends over the K/V the target's last forward returned for its last layer of each kind, cut
  to the sequence's length: for a full layer every position up to the sequence's end (after a
  rejection that includes the rejected draft's K/V at the bonus token's position), for a sliding
  layer the window the forward saw (the `window - 1` before the block and the block itself, rejected
  drafts included), of which the assistant's mask keeps the last `window + 1`;
- the target verifies [last token, drafts] in one forward; the longest prefix of drafts equal to its
  greedy tokens is accepted, plus its own next token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from flashdesk.engine.model.assistant import Assistant
from flashdesk.engine.model.config import FULL
from flashdesk.engine.model.gemma4 import Gemma4
from flashdesk.engine.model.kv_cache import KVCache


@dataclass
class MtpRound:
    drafts: list[int]
    accepted: int


@dataclass
class _Seen:
    """What the target's last forward saw: its first and end positions."""

    start: int
    end: int


@dataclass
class MtpResult:
    tokens: list[int]
    rounds: list[MtpRound] = field(default_factory=list)


def _last_layer(model: Gemma4, kind: str) -> int:
    return max(i for i, spec in enumerate(model.cfg.layers) if spec.kind == kind)


def shared_kv(model: Gemma4, cache: KVCache, seen: _Seen, length: int) -> dict:
    """The target's K/V the assistant attends over for a sequence of `length` tokens after a forward
    over `seen`, read from the cache (see the module's docstring)."""
    out = {}
    for kind in {spec.kind for spec in model.cfg.layers}:
        layer = _last_layer(model, kind)
        if kind == FULL:
            lo, hi = 0, min(seen.end, length)
        else:
            window = model.cfg.sliding_window
            lo = max(0, seen.start - (window - 1))  # what the forward returned, cut to `length` entries
            hi = min(seen.end, lo + length)
        out[kind] = cache.read(layer, lo, hi)
    return out


def mtp_greedy(
    target: Gemma4, assistant: Assistant, prompt: list[int], max_new_tokens: int, k: int, kv_dtype: str = "float32"
) -> MtpResult:
    """Greedy decoding of `prompt` with MTP drafts of up to `k` tokens a round: the same tokens as
    plain greedy decoding, with each round's drafts and accepted count."""
    device = target.device
    cache = target.new_cache(len(prompt) + max_new_tokens + k + 1, kv_dtype, slack=max(16, k + 1))
    out = target.forward(torch.tensor(prompt, device=device), cache, logits_rows="all")
    token = int(out.logits[-1].argmax())
    result = MtpResult([token])
    hidden = out.hidden[-1:]
    seen = _Seen(0, len(prompt))
    limit = len(prompt) + max_new_tokens
    while len(prompt) + len(result.tokens) < limit:
        length = len(prompt) + len(result.tokens)  # the sequence, the last emitted token included
        drafts = _draft(target, assistant, cache, seen, token, hidden, length, min(k, limit - length - 1))
        block = torch.tensor([token, *drafts], device=device)
        start = cache.length
        out = target.forward(block, cache)
        greedy = out.logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == greedy[accepted]:
            accepted += 1
        if drafts:  # with no room left for a draft, this was a plain step
            result.rounds.append(MtpRound(drafts, accepted))
        result.tokens += drafts[:accepted] + [greedy[accepted]]
        token, hidden = greedy[accepted], out.hidden[accepted : accepted + 1]
        cache.rollback(start + accepted + 1)
        seen = _Seen(start, start + len(block))
    del result.tokens[max_new_tokens:]
    return result


def _draft(target, assistant, cache, seen, token: int, hidden, length: int, k: int) -> list[int]:
    kv = shared_kv(target, cache, seen, length)
    drafts = []
    for _ in range(max(0, k)):
        embedding = F.embedding(torch.tensor([token], device=target.device), target.embed) * target.embed_scale
        logits, hidden = assistant.step(embedding, hidden, kv, length - 1)
        token = int(logits[0].argmax())
        drafts.append(token)
    return drafts
