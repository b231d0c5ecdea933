"""Log probabilities of the tokens a generation emits (and of a prompt's tokens), asked for per request.

Which distribution: the target model's own, the log-softmax of its logits (after Gemma's final
softcap, which is part of the model), before the sampler's suppressed tokens, temperature, top-k,
min-p and top-p. That is what OpenAI reports and vLLM's default ("raw" logprobs), and it does not
depend on the sampling settings. With speculative decoding, a token's row comes from the target's
verify pass at its position (the same logits the acceptance test read), so the figures are the
target's, whichever model drafted; a drafter's distribution never shows.

Cost: nothing unless asked. When asked, a step computes the rows on the device next to its tokens
and reads them once after its token read, when the device has already finished the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_TOP = 20  # the most alternatives per token (OpenAI's bound)


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted (or prompt) token: its log probability (None for a prompt's first token, which
    nothing predicts) and the `top` most likely tokens at its position, most likely first (as (id,
    logprob) pairs)."""

    token: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


def logprob_rows(logits: torch.Tensor, chosen: torch.Tensor, top: int) -> torch.Tensor:
    """logits [R, V], chosen ids [R] -> [R, 1 + 2 * top] fp64 on the device: the chosen token's
    log probability, then the top values and their ids (exact in fp64), for one read."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    picked = logp.gather(-1, chosen.view(-1, 1).long())
    if top <= 0:
        return picked.double()
    values, ids = logp.topk(min(top, logp.shape[-1]), dim=-1)
    return torch.cat([picked.double(), values.double(), ids.double()], dim=-1)


def unpack(rows: list[list[float]], tokens: list[int]) -> list[TokenLogprob]:
    """Host rows of `logprob_rows` (read with the step's tokens) -> one TokenLogprob per token."""
    out = []
    for token, row in zip(tokens, rows):
        n = (len(row) - 1) // 2
        top = tuple((int(i), v) for v, i in zip(row[1 : 1 + n], row[1 + n :]))
        out.append(TokenLogprob(int(token), row[0], top))
    return out


def spec_chosen(draft: torch.Tensor, accepted: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """The token at each row of a verify pass over [last, *draft] (on the device, no read): the
    drafts up to the accepted count, then the target's own token; rows past it are cut on the host."""
    rows = torch.arange(draft.shape[0] + 1, device=draft.device)
    return torch.where(rows == accepted, bonus.view(()), torch.cat([draft, bonus.view(1)]))
