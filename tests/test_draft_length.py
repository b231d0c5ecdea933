"""The automatic draft length (engine/decode/draft_length.py): the choice against a brute-force
expected-throughput computation, its learning from acceptance, and, through the engine, output
identical to plain decoding with the costs measured without disturbing the sequence."""

from __future__ import annotations

import itertools

import pytest

from flashdesk.engine.decode.draft_length import AutoDraftLength, StepCosts
from flashdesk.engine.decode.generation import Engine, GenerationRequest
from flashdesk.engine.decode.speculative import AUTO, SpecControl
from tiny_drafter import PROMPTS

K = 15


def costs(draft_ms: float, verify_base_ms: float, verify_per_row_ms: float) -> StepCosts:
    return StepCosts(
        [0.0] + [draft_ms / 1000] * K,
        [0.0] + [(verify_base_ms + m * verify_per_row_ms) / 1000 for m in range(1, K + 2)],
    )


def brute_force_best(p: list[float], c: StepCosts, limit: int) -> int:
    """The K with the most tokens per second, by enumerating every outcome of every K."""

    def expected(k):  # sum over accepted-prefix lengths a of P(a) * (a + 1)
        total = 0.0
        for a in range(k + 1):
            prob = 1.0
            for i in range(1, a + 1):
                prob *= p[i]
            if a < k:
                prob *= 1 - p[a + 1]
            total += prob * (a + 1)
        return total

    return max(range(limit + 1), key=lambda k: (expected(k) / c.step(k), -k))


@pytest.mark.parametrize("rate", [0.05, 0.3, 0.6, 0.8, 0.95])
@pytest.mark.parametrize(
    "shape", [(2.0, 20.0, 0.1), (0.5, 5.0, 1.0), (8.0, 20.0, 0.0)], ids=["gpu-like", "row-bound", "costly-draft"]
)
def test_the_choice_is_the_brute_force_optimum(rate, shape):
    auto = AutoDraftLength(K, costs(*shape))
    for _ in range(60):  # a text where every draft position is accepted with probability `rate`
        accepted = int(rate * 10) % 4 if rate < 0.5 else K - 1
        auto.observe(K, accepted, 0.0, 0.0)
    p = auto.acceptance()
    for limit in (K, 7, 1):
        assert auto.choose(limit) == brute_force_best(p, auto.costs, limit)


def test_it_learns_where_drafts_stop_being_accepted():
    auto = AutoDraftLength(K, costs(2.0, 20.0, 0.1))
    assert auto.choose(K) >= 8  # hopeful at first: long drafts are cheap next to a verify
    for _ in range(40):  # drafts 1-3 accepted, the 4th never
        auto.observe(K, 3, 0.0, 0.0)
    p = auto.acceptance()
    assert p[1] > 0.9 and p[3] > 0.9 and p[4] < 0.2
    assert 3 <= auto.choose(K) <= 6  # little past the 4th: what is beyond it is seldom reached
    for _ in range(100):  # then nothing accepted at all: a plain step is cheaper than any draft
        auto.observe(max(auto.choose(K), 1), 0, 0.0, 0.0)
    assert auto.acceptance()[1] < 0.05 and auto.choose(K) == 0


def test_plain_steps_forget_so_drafting_is_tried_again():
    """A few early misses send auto to plain steps; those see no acceptance, so without this the
    drafter would never be tried again, even once the text turns into code it drafts well."""
    auto = AutoDraftLength(K, costs(1.7, 4.0, 0.4))  # a CPU-like card: a draft is not free
    for _ in range(3):
        auto.observe(max(auto.choose(K), 1), 0, 0.0, 0.0)
    assert auto.choose(K) == 0
    plain_steps = 0
    while auto.choose(K) == 0:
        auto.observe(0, 0, 0.0, 0.0)
        plain_steps += 1
        assert plain_steps < 200, "auto never drafts again"
    assert plain_steps >= 5  # but not at once: the misses still count for a while


def test_measured_step_times_refine_the_costs():
    auto = AutoDraftLength(K, costs(2.0, 20.0, 0.1))
    before = auto.costs.verify[5]
    for _ in range(30):
        auto.observe(4, 4, 0.004, 0.050)
    assert auto.costs.verify[5] == pytest.approx(0.050, rel=0.01) != before
    assert auto.costs.draft[4] == pytest.approx(0.004, rel=0.01)


def test_cached_costs_are_checked_against_the_drafter():
    good = costs(1.0, 2.0, 0.1)
    assert StepCosts.from_json(good.to_json(), K) == good
    assert StepCosts.from_json(good.to_json(), 7) is None  # another block size
    assert StepCosts.from_json({"draft": [0, -1], "verify": []}, 1) is None
    assert StepCosts.from_json({"nothing": 1}, K) is None


@pytest.fixture(scope="module")
def engine(spec_pair):
    target_dir, draft_dir = spec_pair[1]
    return Engine.load(target_dir, device="cpu", draft_dir=draft_dir)


def tokens(engine, prompt, control, n=48):
    *_, finish = engine.generate(GenerationRequest(prompt, n, ignore_eos=True, reuse=False), control)
    return finish


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_auto_gives_the_tokens_of_plain_decoding(engine, prompt):
    plain = tokens(engine, prompt, SpecControl(False))
    auto = tokens(engine, prompt, SpecControl(True, AUTO))
    assert auto.token_ids == plain.token_ids
    assert engine.auto.costs is not None and all(c > 0 for c in engine.auto.costs.verify[1:])
    assert auto.stats["speculative_steps"] > 0  # this drafter is accepted: auto speculates


def test_measuring_the_costs_leaves_the_sequence_as_it_was(engine):
    engine.auto = type(engine.auto)(engine.drafter.max_draft_length)  # no costs yet: the first step measures
    prompt = PROMPTS[1]
    calibrated = tokens(engine, prompt, SpecControl(True, AUTO), n=40)
    assert calibrated.token_ids == tokens(engine, prompt, SpecControl(True, 7), n=40).token_ids
    choices = {engine.auto.choose(k) for k in range(1, K + 1)}
    assert choices <= set(range(K + 1))


def test_auto_switches_between_speculating_and_plain_steps(engine):
    """With acceptance forced to nothing, auto falls back to plain steps; the output stays put."""
    engine.auto.successes = [0.0] * (K + 1)
    engine.auto.trials = [1000.0] * (K + 1)
    engine.auto.costs.draft = [0.0] + [1.0] * K  # a draft that costs a second never pays
    events = [e for e in engine.generate(GenerationRequest(PROMPTS[0], 8, ignore_eos=True), SpecControl(True, AUTO))]
    assert all(not getattr(e, "draft", []) for e in events[1:-1])
    assert events[-1].token_ids == tokens(engine, PROMPTS[0], SpecControl(False), n=8).token_ids
    assert list(itertools.chain(*(e.emitted for e in events[:-1]))) == events[-1].token_ids


def test_measured_costs_are_kept_per_card_and_model(spec_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    target_dir, draft_dir = spec_pair[1]
    first = Engine.load(target_dir, device="cpu", draft_dir=draft_dir)
    assert first.costs_path.parent == tmp_path / "step_costs" and not first.costs_path.exists()
    tokens(first, PROMPTS[0], SpecControl(True, AUTO), n=8)
    assert first.costs_path.is_file()
    second = Engine.load(target_dir, device="cpu", draft_dir=draft_dir)
    assert second.costs_path == first.costs_path

    def never(self, repeats=3):
        raise AssertionError("the costs were measured again")

    monkeypatch.setattr("flashdesk.engine.decode.speculative.Decoder.measure_costs", never)
    tokens(second, PROMPTS[0], SpecControl(True, AUTO), n=8)  # read back from the file instead
    assert second.auto.costs is not None
    other = Engine.load(target_dir, device="cpu", draft_dir=draft_dir, kv_dtype="bfloat16")
    assert other.costs_path != first.costs_path  # other settings, other costs
