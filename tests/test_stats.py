"""Speculative-decoding statistics against values computed by hand from small step lists."""

import pytest

from flashdesk.engine.decode.stats import SpecStats, StepRecord, summarize

KEYS = {
    "by_method",
    "steps",
    "decode_tokens",
    "decode_seconds",
    "decode_tokens_per_second",
    "speculative_steps",
    "drafted",
    "accepted",
    "acceptance_rate",
    "speculative_emitted",
    "mean_acceptance_length",
    "per_position_acceptance",
    "accepted_histogram",
    "draft_seconds",
    "verify_seconds",
}


def spec(k: int, accepted: int, emitted: int | None = None, draft_s: float = 0.01, verify_s: float = 0.04):
    """A speculative step drafting ids 100..100+k-1; by default it emits accepted + 1 ids."""
    n = accepted + 1 if emitted is None else emitted
    return StepRecord(tuple(range(100, 100 + k)), accepted, tuple(range(200, 200 + n)), draft_s, verify_s)


def plain(seconds: float = 0.02):
    """A step with speculation off: one token, its time in verify_seconds."""
    return StepRecord((), 0, (7,), 0.0, seconds)


def check(summary: dict, **want):
    assert set(summary) == KEYS
    for key, value in want.items():
        got = summary[key]
        if value is None or isinstance(value, int) and not isinstance(value, bool):
            assert got == value, key
        elif isinstance(value, list):
            assert len(got) == len(value), key
            assert got == pytest.approx(value), key
        else:
            assert got == pytest.approx(value), key


def test_full_acceptance():
    # 3 steps, each drafts 4, accepts all 4 and emits 4 + the bonus token; 0.05 s per step
    s = summarize([spec(4, 4), spec(4, 4), spec(4, 4)])
    check(
        s,
        steps=3,
        decode_tokens=15,
        decode_seconds=0.15,
        decode_tokens_per_second=100.0,
        speculative_steps=3,
        drafted=12,
        accepted=12,
        acceptance_rate=1.0,
        speculative_emitted=15,
        mean_acceptance_length=5.0,
        per_position_acceptance=[1.0, 1.0, 1.0, 1.0],
        accepted_histogram=[0, 0, 0, 0, 3],
        draft_seconds=0.03,
        verify_seconds=0.12,
    )


def test_partial_acceptance_wrong_from_position_2():
    # drafts of 4 where position 2 (0-based) is wrong: 2 accepted, emitted 2 + the target's correction
    s = summarize([spec(4, 2), spec(4, 2)])
    check(
        s,
        steps=2,
        decode_tokens=6,
        decode_seconds=0.1,
        decode_tokens_per_second=60.0,
        speculative_steps=2,
        drafted=8,
        accepted=4,
        acceptance_rate=0.5,
        mean_acceptance_length=3.0,
        per_position_acceptance=[1.0, 1.0, 0.0, 0.0],
        accepted_histogram=[0, 0, 2, 0, 0],
    )


def test_zero_acceptance():
    # every draft wrong at position 0: each step still emits the target's own token
    s = summarize([spec(4, 0), spec(4, 0), spec(4, 0), spec(4, 0)])
    check(
        s,
        steps=4,
        decode_tokens=4,
        decode_seconds=0.2,
        decode_tokens_per_second=20.0,
        speculative_steps=4,
        drafted=16,
        accepted=0,
        acceptance_rate=0.0,
        mean_acceptance_length=1.0,
        per_position_acceptance=[0.0, 0.0, 0.0, 0.0],
        accepted_histogram=[4, 0, 0, 0, 0],
    )


MIXED = [spec(2, 2), spec(4, 1), spec(4, 3), spec(3, 3)]  # the draft length changes mid-run


def test_mixed_draft_lengths():
    # drafted 2+4+4+3 = 13, accepted 2+1+3+3 = 9, emitted 3+2+4+4 = 13
    # position 0: all 4 steps drafted it, all 4 accepted it                      -> 4/4
    # position 1: all 4 drafted it; accepted by the steps with accepted > 1: 3   -> 3/4
    # position 2: drafted by the 4-, 4-, 3-long drafts; accepted by the 2nd, 3rd -> 2/3
    # position 3: drafted by the two 4-long drafts; accepted by neither          -> 0/2
    # histogram of accepted counts 2, 1, 3, 3 over 0..4
    s = summarize(MIXED)
    check(
        s,
        steps=4,
        decode_tokens=13,
        decode_seconds=0.2,
        decode_tokens_per_second=65.0,
        speculative_steps=4,
        drafted=13,
        accepted=9,
        acceptance_rate=9 / 13,
        mean_acceptance_length=3.25,
        per_position_acceptance=[1.0, 0.75, 2 / 3, 0.0],
        accepted_histogram=[0, 1, 1, 2, 0],
        draft_seconds=0.04,
        verify_seconds=0.16,
    )


def test_steps_without_speculation_count_for_speed_but_not_for_acceptance():
    # the mixed run with two plain steps (0.02 s, one token each) interleaved
    steps = [plain(), MIXED[0], MIXED[1], plain(), MIXED[2], MIXED[3]]
    s = summarize(steps)
    check(
        s,
        steps=6,
        decode_tokens=15,
        decode_seconds=0.24,
        decode_tokens_per_second=62.5,
        speculative_steps=4,
        drafted=13,
        accepted=9,
        acceptance_rate=9 / 13,
        mean_acceptance_length=3.25,
        per_position_acceptance=[1.0, 0.75, 2 / 3, 0.0],
        accepted_histogram=[0, 1, 1, 2, 0],
        draft_seconds=0.04,
        verify_seconds=0.2,
    )


def test_only_plain_steps():
    s = summarize([plain(0.05), plain(0.05)])
    check(
        s,
        steps=2,
        decode_tokens=2,
        decode_seconds=0.1,
        decode_tokens_per_second=20.0,
        speculative_steps=0,
        drafted=0,
        accepted=0,
        acceptance_rate=None,
        mean_acceptance_length=None,
        per_position_acceptance=[],
        accepted_histogram=[],
        draft_seconds=0.0,
        verify_seconds=0.1,
    )


def test_empty():
    s = summarize([])
    check(
        s,
        steps=0,
        decode_tokens=0,
        decode_seconds=0.0,
        decode_tokens_per_second=0.0,
        speculative_steps=0,
        drafted=0,
        accepted=0,
        acceptance_rate=None,
        mean_acceptance_length=None,
        per_position_acceptance=[],
        accepted_histogram=[],
        draft_seconds=0.0,
        verify_seconds=0.0,
    )
    assert SpecStats().summary() == s


def test_step_cut_short_by_eos_counts_what_was_emitted():
    # 4 drafted and accepted, but the 2nd id was EOS: the step emitted 2 ids, not 5
    s = summarize([spec(4, 4, emitted=2), spec(4, 1)])
    check(
        s,
        decode_tokens=4,
        acceptance_rate=5 / 8,
        mean_acceptance_length=2.0,
        per_position_acceptance=[1.0, 0.5, 0.5, 0.5],
        accepted_histogram=[0, 1, 0, 0, 1],
    )


def test_live_summary_matches_the_summary_of_the_steps_so_far():
    steps = [plain(), MIXED[0], MIXED[1], plain(), MIXED[2], MIXED[3]]
    live = SpecStats()
    for n, step in enumerate(steps, 1):
        live.add(step)
        assert live.summary() == summarize(steps[:n])


def test_records_are_immutable_tuples():
    step = StepRecord([1, 2, 3], 1, [1, 9], 0.0, 0.1)
    assert step.draft == (1, 2, 3) and step.emitted == (1, 9)


@pytest.mark.parametrize(
    "args, message",
    [
        (((1, 2), 3, (1, 2, 3), 0.0, 0.1), "outside 0..2"),
        (((1, 2), -1, (), 0.0, 0.1), "outside 0..2"),
        (((), 1, (5,), 0.0, 0.1), "outside 0..0"),
        (((1, 2, 3), 1, (1, 2, 3), 0.0, 0.1), "at most accepted"),
        (((), 0, (5,), -0.1, 0.1), "negative"),
    ],
)
def test_impossible_records_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        StepRecord(*args)


def test_each_named_method_gets_its_own_figures():
    """Steps drafted by DFlash and by MTP in one generation: each method's acceptance from its own steps."""
    steps = [
        StepRecord((1, 2, 3), 3, (1, 2, 3, 4), 0.1, 0.1, "dflash"),
        StepRecord((5, 6), 0, (7,), 0.1, 0.1, "mtp"),
        StepRecord((), 0, (8,), 0.0, 0.1),
        StepRecord((9, 9), 1, (9, 10), 0.1, 0.1, "mtp"),
    ]
    s = summarize(steps)
    assert s["drafted"] == 7 and s["accepted"] == 4
    assert set(s["by_method"]) == {"dflash", "mtp"}
    assert s["by_method"]["dflash"]["acceptance_rate"] == 1.0
    assert s["by_method"]["mtp"]["acceptance_rate"] == 0.25
    assert s["by_method"]["mtp"]["speculative_steps"] == 2 and s["by_method"]["mtp"]["decode_tokens"] == 3
