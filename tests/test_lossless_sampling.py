"""Speculative sampling is lossless: what it emits is distributed as the target's own samples."""

import pytest
import torch

from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest
from flashdesk.engine.decode.sampling import SamplingParams, draw, make_generator, probabilities, verify_draft
from flashdesk.engine.decode.speculative import SpecControl


def chi2_critical(dof: int, z: float = 3.09) -> float:
    """Chi-square critical value at significance 0.001 (Wilson-Hilferty; within 1% for dof >= 3)."""
    return dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3


def chi_square(counts: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token the target can never produce was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def wrong_residual_verify(draft, q, logits, params, gen):
    """The classic bug: on rejection, resample from p instead of norm(max(p - q, 0))."""
    p = probabilities(logits, params)
    for i, token in enumerate(draft.tolist()):
        if torch.rand(1, generator=gen) * q[i, token] >= p[i, token]:
            return i, int(draw(p[i], gen))
    return len(draft), int(draw(p[-1], gen))


def first_two_tokens(verify, p_logits, q_logits, params, n, seed):
    """Joint counts of the first two emitted tokens over n independent speculative steps.

    The 'target' is context-free (row i is the distribution at position i whatever came before),
    so the next step would draw position 1 from p[1] when the first step stopped at one token.
    """
    vocab = p_logits.shape[-1]
    gen = make_generator(SamplingParams(temperature=1.0, seed=seed), "cpu")
    q = probabilities(q_logits, params)
    p = probabilities(p_logits, params)
    counts = torch.zeros(vocab * vocab)
    for _ in range(n):
        draft = draw(q, gen)
        accepted, bonus = (int(x) for x in verify(draft, q, p_logits, params, gen))
        emitted = draft[:accepted].tolist() + [bonus]
        second = emitted[1] if len(emitted) > 1 else int(draw(p[1], gen))
        counts[emitted[0] * vocab + second] += 1
    return counts, (p[0][:, None] * p[1][None, :]).reshape(-1) * n


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=4),
        SamplingParams(temperature=1.2, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.1),  # cuts the first two rows to 3 and 2 of 5 tokens
        SamplingParams(temperature=1.1, top_p=0.9, min_p=0.05),
    ],
    ids=["plain", "top-k", "top-p", "min-p", "min-p-top-p"],
)
def test_rejection_sampling_reproduces_the_target_distribution(params):
    gen = torch.Generator().manual_seed(0)
    p_logits = torch.randn(4, 5, generator=gen) * 1.5  # k = 3 drafts, 5-token vocabulary
    q_logits = torch.randn(3, 5, generator=gen) * 1.5  # a draft distribution far from p
    counts, expected = first_two_tokens(verify_draft, p_logits, q_logits, params, 20000, seed=1)
    dof = int((expected > 0).sum()) - 1
    assert chi_square(counts, expected) < chi2_critical(dof)


def test_the_threshold_catches_a_wrong_residual():
    """The same statistic rejects a verifier that resamples from p on rejection."""
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    p_logits = torch.randn(4, 5, generator=gen) * 1.5
    q_logits = torch.randn(3, 5, generator=gen) * 1.5
    counts, expected = first_two_tokens(wrong_residual_verify, p_logits, q_logits, params, 20000, seed=1)
    assert chi_square(counts, expected) > 5 * chi2_critical(24)


def test_engine_samples_with_speculation_like_without(spec_pair):
    """End to end on the tiny target (top-k 3, so 3 x 3 outcomes): the first two decoded tokens
    after the prefill token, over many seeds, with and without the drafter (two-sample chi-square)."""
    engine = spec_pair[0]
    params = dict(temperature=1.0, top_k=3)
    prompt = [2, 105, 300, 301, 302, 106, 107, 105, 481, 107]

    def outcomes(enabled):
        seen = {}
        for seed in range(400):
            request = GenerationRequest(prompt, 3, SamplingParams(seed=seed, **params), ignore_eos=True)
            finish = [e for e in engine.generate(request, SpecControl(enabled, 2)) if isinstance(e, FinishEvent)][0]
            key = tuple(finish.token_ids)
            seen[key] = seen.get(key, 0) + 1
        return seen

    with_spec, without = outcomes(True), outcomes(False)
    keys = sorted(set(with_spec) | set(without))
    a = torch.tensor([with_spec.get(k, 0) for k in keys], dtype=torch.float64)
    b = torch.tensor([without.get(k, 0) for k in keys], dtype=torch.float64)
    total = a + b
    keep = total >= 5  # pool rare outcomes: the chi-square approximation needs expected counts >= 5
    a = torch.cat([a[keep], a[~keep].sum()[None]])
    b = torch.cat([b[keep], b[~keep].sum()[None]])
    stat = float(((a - b) ** 2 / (a + b).clamp_min(1)).sum())  # two samples of equal size
    dof = len(a) - 1
    assert dof >= 8
    assert stat < chi2_critical(dof)


def test_engine_samples_with_min_p_and_speculation_like_without(spec_pair):
    """min_p is applied to the target's rows at verification as at sampling: with and without the
    drafter, the first decoded tokens have the same distribution (two-sample chi-square)."""
    params = [SamplingParams(temperature=1.0, seed=seed, min_p=0.1) for seed in range(300)]
    assert_same_distribution(first_tokens(spec_pair[0], params, True), first_tokens(spec_pair[0], params, False))


PROMPT = [2, 105, 300, 301, 302, 106, 107, 105, 481, 107]


def first_tokens(engine, params: list[SamplingParams], speculate: bool, prompt=PROMPT, n: int = 3) -> dict:
    """How often each sequence of the first n tokens comes out, one generation per sampling (seed)."""
    seen: dict = {}
    for sampling in params:
        request = GenerationRequest(prompt, n, sampling, ignore_eos=True)
        finish = [e for e in engine.generate(request, SpecControl(speculate, 2)) if isinstance(e, FinishEvent)][0]
        seen[tuple(finish.token_ids)] = seen.get(tuple(finish.token_ids), 0) + 1
    return seen


def assert_same_distribution(a_counts: dict, b_counts: dict, min_dof: int = 5) -> None:
    """Two samples of equal size from the same distribution: a two-sample chi-square at significance
    0.001, rare outcomes pooled (the approximation needs expected counts of 5 or more)."""
    keys = sorted(set(a_counts) | set(b_counts))
    a = torch.tensor([a_counts.get(k, 0) for k in keys], dtype=torch.float64)
    b = torch.tensor([b_counts.get(k, 0) for k in keys], dtype=torch.float64)
    keep = (a + b) >= 5
    a = torch.cat([a[keep], a[~keep].sum()[None]])
    b = torch.cat([b[keep], b[~keep].sum()[None]])
    stat = float(((a - b) ** 2 / (a + b).clamp_min(1)).sum())
    assert len(a) - 1 >= min_dof
    assert stat < chi2_critical(len(a) - 1)
