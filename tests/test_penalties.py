"""Penalties on used tokens: repetition as transformers applies it, presence and frequency as OpenAI
defines them, and speculation exact under all three (each verify row counts the drafts before it)."""

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest
from flashdesk.engine.decode.penalties import Penalties
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.speculative import SpecControl
from test_lossless_sampling import assert_same_distribution, first_tokens
from tiny_drafter import PROMPTS

VOCAB = 40


def _transformers_repetition(logits: torch.Tensor, history: list[int], penalty: float) -> torch.Tensor:
    return RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([history]), logits[None].clone())[0]


def _openai(scores: torch.Tensor, reply: list[int], presence: float, frequency: float) -> torch.Tensor:
    """OpenAI's formula, token by token: mu[j] - c[j] * frequency - (c[j] > 0) * presence."""
    out = scores.clone()
    for token in set(reply):
        count = reply.count(token)
        out[token] -= count * frequency + presence
    return out


def test_repetition_penalty_equals_transformers_on_every_verify_row():
    """Row i of a verify pass is penalized for the prompt, the reply and drafts[:i], as transformers'
    processor penalizes the history plain decoding would have had there."""
    gen = torch.Generator().manual_seed(0)
    prompt, reply, drafts = [3, 5, 5, 9], [11, 3, 20], torch.tensor([20, 7, 7, 30])
    logits = torch.randn(len(drafts) + 1, VOCAB, generator=gen) * 3
    for penalty in (1.3, 0.7):
        penalties = Penalties(SamplingParams(repetition_penalty=penalty), VOCAB, torch.device("cpu"), prompt)
        penalties.add(reply)
        ours = penalties.apply(logits, drafts)
        for i in range(len(drafts) + 1):
            history = prompt + reply + drafts[:i].tolist()
            torch.testing.assert_close(ours[i], _transformers_repetition(logits[i], history, penalty), rtol=0, atol=0)
        assert not torch.equal(ours[0], logits[0])  # it did penalize


def test_presence_and_frequency_count_the_reply_and_the_drafts_before_each_row_not_the_prompt():
    gen = torch.Generator().manual_seed(1)
    prompt, reply, drafts = [4, 4, 8], [8, 12, 12], torch.tensor([12, 6, 6])
    logits = torch.randn(len(drafts) + 1, VOCAB, generator=gen)
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.2)
    penalties = Penalties(params, VOCAB, torch.device("cpu"), prompt)
    penalties.add(reply)
    ours = penalties.apply(logits, drafts)
    for i in range(len(drafts) + 1):
        seen = reply + drafts[:i].tolist()
        repeated = _transformers_repetition(logits[i], prompt + seen, 1.2)
        torch.testing.assert_close(ours[i], _openai(repeated, seen, 0.5, 0.25))
    assert ours[0, 4] == _transformers_repetition(logits[0], prompt, 1.2)[4]  # prompt only: no presence penalty


@pytest.mark.parametrize(
    "bad", [dict(repetition_penalty=0), dict(repetition_penalty=float("inf")), dict(presence_penalty=2.5)]
)
def test_penalties_outside_their_ranges_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_greedy_with_repetition_penalty_equals_transformers_with_and_without_speculation(spec_pair):
    engine, _, reference, _ = spec_pair
    prompt = PROMPTS[0]
    with torch.no_grad():
        seq = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=32,
            do_sample=False,
            repetition_penalty=1.5,
            eos_token_id=None,
            pad_token_id=0,
        )
    want = seq[0, len(prompt) :].tolist()
    free = _greedy(engine, prompt, SamplingParams(), SpecControl(False))
    assert free != want  # the penalty changes this reply: the comparison below can fail
    params = SamplingParams(repetition_penalty=1.5)
    assert _greedy(engine, prompt, params, SpecControl(False)) == want
    for k in (3, 15):
        assert _greedy(engine, prompt, params, SpecControl(True, k)) == want, f"K={k}"


def test_greedy_with_presence_and_frequency_penalties_is_the_same_with_speculation(spec_pair):
    engine = spec_pair[0]
    prompt = PROMPTS[1]
    params = SamplingParams(presence_penalty=1.5, frequency_penalty=1.0)
    plain = _greedy(engine, prompt, params, SpecControl(False))
    assert plain != _greedy(engine, prompt, SamplingParams(), SpecControl(False))
    for k in (2, 7):
        assert _greedy(engine, prompt, params, SpecControl(True, k)) == plain, f"K={k}"


def test_sampling_with_penalties_and_speculation_is_distributed_as_without(spec_pair):
    """The first tokens sampled with the penalties, with and without the drafter: the same
    distribution (two-sample chi-square at significance 0.001)."""
    params = [  # a low temperature: outcomes frequent enough to compare
        SamplingParams(0.3, seed=seed, repetition_penalty=1.8, presence_penalty=1.0, frequency_penalty=0.5)
        for seed in range(400)
    ]
    engine = spec_pair[0]
    assert_same_distribution(first_tokens(engine, params, True), first_tokens(engine, params, False))


def _greedy(engine, prompt, params, control) -> list[int]:
    request = GenerationRequest(prompt, 32, params, ignore_eos=True)
    return [e for e in engine.generate(request, control) if isinstance(e, FinishEvent)][0].token_ids
