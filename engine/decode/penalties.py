"""Penalties on tokens already used: repetition (transformers' and vLLM's), presence and frequency (OpenAI's).

- repetition_penalty r: a token in the prompt or the reply so far has its score divided by r where
  positive and multiplied by r where negative (transformers' RepetitionPenaltyLogitsProcessor, vLLM).
- presence_penalty a, frequency_penalty f: a token the reply has used c times loses f * c + a * (c > 0)
  (OpenAI's formula, on the reply's tokens only, as vLLM applies it), after the repetition penalty.

Why per row: a speculative step scores the last token and K drafts in one target pass, and row i
stands for the position after the first i drafts. Plain decoding there would have penalized those
drafts too, so row i counts them (`apply(logits, drafts)`); row i only matters when they were all
accepted, so its history is then exactly the one plain decoding saw. The drafts' own distribution
(q) is left unpenalized: rejection sampling is exact for any q, a closer q only accepts more.
The counts are device tensors, updated from the tokens a step emitted after its one read.
"""

from __future__ import annotations

import torch

from flashdesk.engine.decode.sampling import SamplingParams


def wanted(params: SamplingParams) -> bool:
    """Whether params ask for any penalty (none: the logits pass untouched, at no cost)."""
    return params.repetition_penalty != 1 or params.presence_penalty != 0 or params.frequency_penalty != 0


class Penalties:
    """One generation's token counts, and the penalties they give each scored row."""

    def __init__(self, params: SamplingParams, vocab: int, device: torch.device, prompt: list[int]):
        self.repetition = params.repetition_penalty
        self.presence = params.presence_penalty
        self.frequency = params.frequency_penalty
        self.device = device
        self.in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.in_prompt[self._ids(prompt)] = True
        self.counts = torch.zeros(vocab, dtype=torch.int32, device=device)  # in the reply so far

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long).to(self.device)

    def add(self, emitted: list[int]) -> None:
        """Count a step's emitted tokens (after its read: the device has nothing queued to wait for)."""
        if emitted:
            ones = torch.ones(len(emitted), dtype=torch.int32, device=self.device)
            self.counts.index_add_(0, self._ids(emitted), ones)

    def apply(self, logits: torch.Tensor, drafts: torch.Tensor | None = None) -> torch.Tensor:
        """logits [n, V] -> penalized fp32 scores [n, V]; row i also counts drafts[:i] (drafts [n - 1])."""
        n, vocab = logits.shape
        counts = self.counts.expand(n, vocab)
        if drafts is not None and drafts.numel():
            rows, cols = torch.tril_indices(n, drafts.numel(), offset=-1, device=logits.device)  # draft j < row i
            extra = torch.zeros(n, vocab, dtype=torch.int32, device=logits.device)
            extra.index_put_((rows, drafts[cols]), torch.ones_like(rows, dtype=torch.int32), accumulate=True)
            counts = counts + extra
        scores = logits.float()
        used = counts > 0
        if self.repetition != 1:
            scaled = torch.where(scores > 0, scores / self.repetition, scores * self.repetition)
            scores = torch.where(used | self.in_prompt, scaled, scores)
        if self.frequency:
            scores = scores - self.frequency * counts
        if self.presence:
            scores = scores - self.presence * used
        return scores
