"""Token sampling, on the device, defined as z-lab's `dflash` package defines it.

Order: temperature, then top-k (keep the k largest scores), then softmax, then min-p (keep a token
whose probability is at least min_p times the most likely one's), then top-p (keep a token while
the mass of the tokens ranked above it is below p), then renormalize. Temperature 0 is greedy
(argmax). Min-p is vLLM's: taken on the tempered distribution before top-k and top-p; it commutes
with top-k (a ratio to the top token does not change when the tail is cut), so it can come after.
Every filter depends on the row's logits alone, so the target's verification sees exactly the
distribution it would have sampled from, and speculative sampling stays lossless. The same
`probabilities()` serves the target (p) and the drafter (q) so that speculative rejection sampling
sees both through the same filters. Tokens in `suppress` (a
checkpoint's generation_config.json `suppress_tokens`) get a score of -inf before anything else,
as transformers' SuppressTokensLogitsProcessor does: never emitted, greedy or sampled, and a draft
proposing one is rejected. Penalties on tokens already used come before all of this (penalties.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    suppress: tuple[int, ...] = ()  # token ids never emitted
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off (penalties.py)
    presence_penalty: float = 0.0  # 0: off
    frequency_penalty: float = 0.0  # 0: off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 < self.repetition_penalty < math.inf:
            raise ValueError(f"repetition_penalty must be above 0 (1 turns it off), got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2] (0 turns it off), got {getattr(self, name)}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def suppressed(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits with params.suppress set to -inf (the same tensor when there are none)."""
    if not params.suppress:
        return logits
    return logits.index_fill(-1, _ids_on(params.suppress, logits.device), float("-inf"))


@functools.lru_cache(maxsize=8)
def _ids_on(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The ids as a device tensor, copied once: a copy from the host every step would wait for the
    kernels before it (a pageable copy), and a step is launched before the last one's tokens are read."""
    return torch.tensor(ids, dtype=torch.long, device=device)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> filtered probabilities [..., V] in fp32 (params must not be greedy)."""
    scores = suppressed(logits.float(), params) / params.temperature
    vocab = scores.shape[-1]
    indices = None
    if 0 < params.top_k < vocab:
        scores, indices = torch.topk(scores, params.top_k, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if params.min_p > 0:
        floor = probs.amax(dim=-1, keepdim=True) * params.min_p
        probs = torch.where(probs >= floor, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs * keep)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if indices is not None:
        probs = torch.zeros(logits.shape, dtype=probs.dtype, device=probs.device).scatter(-1, indices, probs)
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs [..., V]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def make_generator(params: SamplingParams, device) -> torch.Generator | None:
    """A seeded generator on the device, or None for greedy decoding (which draws nothing)."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    if params.seed is None:
        gen.seed()
    else:
        gen.manual_seed(params.seed)
    return gen


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Pick one token per row of logits [..., V]."""
    if params.greedy:
        return torch.argmax(suppressed(logits, params), dim=-1)
    return draw(probabilities(logits, params), generator)


def verify_draft(
    draft: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of draft [k] against target logits [k+1, V]: (accepted, next token) as
    0-dim device tensors, computed without reading anything back to the host.

    Greedy: the longest prefix that equals the target's argmax, then the target's own token.
    Sampling (draft_probs [k, V] = q, the drafter's filtered distribution): accept d_i with
    probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw from the residual
    norm(max(p - q, 0)); if all are accepted draw from p at the last row (q is taken as 0 there).
    Lossless: the output is distributed exactly as the target's own samples (Leviathan et al. 2023;
    dflash's loop).
    """
    k = draft.shape[0]
    if params.greedy:
        best = suppressed(target_logits, params).argmax(dim=-1)
        accepted = (draft == best[:k]).int().cumprod(0).sum()
        return accepted, best.index_select(0, accepted.view(1)).view(())
    assert draft_probs is not None  # sampled drafts come with their distributions
    p = probabilities(target_logits, params)
    rows = torch.arange(k, device=draft.device)
    p_d, q_d = p[rows, draft], draft_probs[rows, draft]
    u = torch.rand(k, generator=generator, device=draft.device)
    accepted = (u * q_d < p_d).int().cumprod(0).sum()
    at = accepted.view(1)
    q_rows = torch.cat([draft_probs, torch.zeros_like(draft_probs[:1])])
    p_row = p.index_select(0, at)[0]
    residual = (p_row - q_rows.index_select(0, at)[0]).clamp_min(0)
    total = residual.sum()
    residual = torch.where(total > 0, residual / total, p_row)
    return accepted, draw(residual, generator)
