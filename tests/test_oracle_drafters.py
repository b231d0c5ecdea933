"""Drafters whose quality we choose: one that knows the target's answer, one wrong from position j.

They drive the real loop through full and partial acceptance, and the statistics it reports are
checked against values computed by hand.
"""

import pytest
import torch

from flashdesk.engine.decode.generation import GenerationRequest
from flashdesk.engine.decode.speculative import SpecControl

PROMPT = [2, 105, 300, 301, 302, 106, 107, 105, 481, 107]


def install_oracle(engine, monkeypatch, prompt):
    """Replace the drafter's logits by the target's own greedy answer (optionally spoiled from j)."""
    plain = [e for e in engine.generate(GenerationRequest(prompt, 64, ignore_eos=True), SpecControl(False))][-1]
    answer = prompt + plain.token_ids  # token at every absolute position
    vocab = engine.model.cfg.vocab_size
    wrong_from = {"j": None}

    def draft_logits(ctx, anchor, k):
        start = ctx.length  # the anchor's position
        assert anchor == answer[start]
        logits = torch.zeros(k, vocab)
        for i in range(k):
            token = answer[start + 1 + i]
            if wrong_from["j"] is not None and i >= wrong_from["j"]:
                token = (token + 1) % vocab
            logits[i, token] = 10.0
        return logits

    monkeypatch.setattr(engine.drafter, "draft_logits", draft_logits)
    return engine, plain, wrong_from


@pytest.fixture
def oracle(spec_pair, monkeypatch):
    return install_oracle(spec_pair[0], monkeypatch, PROMPT)


def run(engine, k, max_new):
    events = list(engine.generate(GenerationRequest(PROMPT, max_new, ignore_eos=True), SpecControl(True, k)))
    return events[-1]


def test_a_drafter_that_knows_the_answer_is_always_accepted(oracle):
    engine, plain, _ = oracle
    finish = run(engine, 4, 31)  # 1 token from the prefill, then 6 steps of 5, ending with 4 + 1
    assert finish.token_ids == plain.token_ids[:31]
    s = finish.stats
    assert s["steps"] == s["speculative_steps"] == 6
    assert s["drafted"] == s["accepted"] == 4 * 6  # remaining 30, 25, ..., 5: k stays 4
    assert s["acceptance_rate"] == 1.0
    assert s["mean_acceptance_length"] == 5.0
    assert s["per_position_acceptance"] == [1.0, 1.0, 1.0, 1.0]
    assert s["accepted_histogram"] == [0, 0, 0, 0, 6]
    assert s["decode_tokens"] == 30


def test_a_drafter_wrong_from_position_two_gets_two_accepted(oracle):
    engine, plain, wrong = oracle
    wrong["j"] = 2
    finish = run(engine, 4, 31)
    assert finish.token_ids == plain.token_ids[:31]
    s = finish.stats
    # each step: 2 accepted + the target's token = 3 emitted; remaining 30 -> 10 steps, the last with
    # k = min(4, 3) = 3 drafts
    assert s["steps"] == 10
    assert s["drafted"] == 9 * 4 + 3
    assert s["accepted"] == 20
    assert s["acceptance_rate"] == pytest.approx(20 / 39)
    assert s["mean_acceptance_length"] == 3.0
    assert s["per_position_acceptance"] == [1.0, 1.0, 0.0, 0.0]
    assert s["accepted_histogram"] == [0, 0, 10, 0, 0]


def test_a_drafter_wrong_from_the_start_costs_nothing_in_output(oracle):
    engine, plain, wrong = oracle
    wrong["j"] = 0
    finish = run(engine, 7, 12)
    assert finish.token_ids == plain.token_ids[:12]
    s = finish.stats
    assert s["accepted"] == 0 and s["mean_acceptance_length"] == 1.0
    assert s["steps"] == 11
    assert s["per_position_acceptance"] == [0.0] * 7
    assert s["accepted_histogram"] == [11, 0, 0, 0, 0, 0, 0, 0]


def test_eos_inside_an_accepted_block_ends_the_output_there(spec_pair, monkeypatch):
    """The oracle drafts 15 tokens that are all accepted; a stop token planted at the target's 10th
    token cuts the block there, and nothing after it leaks."""
    prompt = [2, 370, 176, 417, 191, 202]  # greedy: 489 310 310 310 4 4 4 4 4 179 179 ...
    engine, plain, _ = install_oracle(spec_pair[0], monkeypatch, prompt)
    first = 9
    stop = plain.token_ids[first]
    assert plain.token_ids.index(stop) == first  # its first appearance, mid-block
    monkeypatch.setattr(engine, "eos", {stop})
    events = list(engine.generate(GenerationRequest(prompt, 40), SpecControl(True, 15)))
    finish, last = events[-1], events[-2]
    assert finish.finish_reason == "stop"
    assert finish.token_ids == plain.token_ids[: first + 1]
    assert last.accepted == 15 and len(last.emitted) == first  # the block was cut after the stop token
