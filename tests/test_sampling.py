"""Sampling: the same distributions as z-lab's dflash package, drawn on the device, reproducible by seed."""

import pytest
import torch

from flashdesk.engine.decode.sampling import SamplingParams, make_generator, probabilities, sample

dflash_model = pytest.importorskip(
    "dflash.model", reason="z-lab's dflash is a test dependency (packaging/setup.sh --tests installs it)"
)


@pytest.mark.parametrize(
    "temperature, top_p, top_k",
    [
        (1.0, 1.0, 0),
        (0.7, 1.0, 0),
        (0.7, 0.9, 0),
        (1.3, 1.0, 20),
        (0.8, 0.5, 50),
        (1.0, 0.95, 64),
        (0.5, 0.3, 3),
    ],
)
def test_probabilities_match_dflash(temperature, top_p, top_k):
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0)) * 3
    ours = probabilities(logits, SamplingParams(temperature, top_p, top_k))
    theirs = dflash_model._sampling_probs(logits, temperature, top_p, top_k)
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert torch.allclose(ours.sum(-1), torch.ones(5))
    if top_k:
        assert ((ours > 0).sum(-1) <= top_k).all()


def test_greedy_is_argmax_and_needs_no_generator():
    logits = torch.randn(4, 50)
    params = SamplingParams()
    assert make_generator(params, "cpu") is None
    assert torch.equal(sample(logits, params, None), logits.argmax(-1))


def test_seed_makes_draws_reproducible_and_different_seeds_differ():
    logits = torch.zeros(200, 100)

    def draws(seed):
        params = SamplingParams(temperature=1.0, seed=seed)
        return sample(logits, params, make_generator(params, "cpu"))

    assert torch.equal(draws(1), draws(1))
    assert not torch.equal(draws(1), draws(2))


def test_draws_follow_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -5.0]])
    params = SamplingParams(temperature=1.0, top_k=3, seed=0)
    gen = make_generator(params, "cpu")
    counts = (
        torch.bincount(torch.stack([sample(logits, params, gen) for _ in range(4000)]).view(-1), minlength=5).float()
        / 4000
    )
    expected = probabilities(logits, params)[0]
    assert counts[3:].sum() == 0
    assert (counts - expected).abs().max() < 0.03


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2)])
def test_invalid_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_suppressed_tokens_are_never_picked_greedy_or_sampled():
    from flashdesk.engine.decode.sampling import verify_draft

    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]])
    assert sample(logits, SamplingParams(suppress=(1,)), None).tolist() == [2]
    probs = probabilities(logits, SamplingParams(temperature=1.0, suppress=(1, 3)))
    assert probs[0, 1] == 0 and probs[0, 3] == 0 and torch.isclose(probs.sum(), torch.tensor(1.0))
    accepted, bonus = verify_draft(torch.tensor([1]), None, logits.repeat(2, 1), SamplingParams(suppress=(1,)), None)
    assert (int(accepted), int(bonus)) == (0, 2)  # a draft of a suppressed token is rejected


def test_min_p_keeps_the_tokens_within_its_share_of_the_top_one():
    """vLLM's min-p: on the tempered distribution, drop a token below min_p x the top token's
    probability, renormalize; then top-k and top-p as without it (min-p commutes with top-k)."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(3)) * 3
    for temperature, top_p, top_k, min_p in ((1.0, 1.0, 0, 0.1), (0.7, 0.9, 0, 0.05), (1.3, 0.8, 20, 0.2)):
        ours = probabilities(logits, SamplingParams(temperature, top_p, top_k, min_p=min_p))
        tempered = torch.softmax(logits / temperature, dim=-1)
        kept = tempered >= tempered.amax(-1, keepdim=True) * min_p
        floored = logits.masked_fill(~kept, float("-inf"))  # vLLM: min-p first, as -inf logits
        reference = probabilities(floored, SamplingParams(temperature, top_p, top_k))
        assert torch.allclose(ours, reference, atol=1e-6)
        assert ((ours > 0) <= kept).all() and torch.allclose(ours.sum(-1), torch.ones(6))
    top = probabilities(logits, SamplingParams(1.0, min_p=1.0))
    assert torch.equal(top.argmax(-1), logits.argmax(-1)) and ((top > 0).sum(-1) == 1).all()  # 1: greedy


@pytest.mark.parametrize("min_p", [-0.1, 1.5, float("nan")])
def test_min_p_outside_0_to_1_is_refused(min_p):
    with pytest.raises(ValueError):
        SamplingParams(temperature=1.0, min_p=min_p)
