"""Pipelined generation (on by default on a GPU): each step is launched before the previous step's
tokens are handed on, so the host's work on them runs while the device computes. It must change
nothing but when the work is enqueued: the same events, the same text, the same state left for the
next request, whether the generation ends by length, by a stop string (the step launched ahead is
undone) or by the consumer closing it."""

import pytest

from flashdesk.engine.decode import speculative
from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest, StepEvent
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.speculative import SpecControl
from flashdesk.kernels.backend import kernels
from tiny_drafter import PROMPTS


@pytest.fixture
def engine(spec_pair):
    engine = spec_pair[0]
    yield engine
    engine.pipelined = False  # the CPU default


def run(engine, pipelined, request, control=None, keep=None):
    """The events of a generation (the first `keep` only, then the consumer closes it)."""
    engine.pipelined = pipelined
    events = []
    stream = engine.generate(request, control)
    for event in stream:
        events.append(event)
        if keep is not None and len(events) == keep:
            stream.close()
            break
    return events


def shape(events):
    """What a consumer sees, less the timings."""
    return [
        (e.index, e.emitted, e.draft, e.accepted, e.answer, e.thought)
        if isinstance(e, StepEvent)
        else (e.finish_reason, e.token_ids, e.text, e.stats["reused_tokens"])
        for e in events
    ]


@pytest.mark.parametrize(
    "control", [SpecControl(False), SpecControl(True, 15), SpecControl(True, 4)], ids=["plain", "k15", "k4"]
)
@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_k=30, seed=3)], ids=["greedy", "sampled"]
)
def test_pipelined_steps_give_the_same_events(engine, control, sampling):
    request = GenerationRequest(PROMPTS[0], 40, sampling, ignore_eos=True, reuse=False)
    pipelined, plain = run(engine, True, request, control), run(engine, False, request, control)
    assert shape(pipelined) == shape(plain)
    assert (pipelined[-1].stats["pipelined"], plain[-1].stats["pipelined"]) == (True, False)


def test_a_step_is_launched_before_the_previous_one_is_handed_on(engine, monkeypatch):
    launched = []
    original = speculative.Decoder.launch

    def counting(self, *args, **kwargs):
        launched.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(speculative.Decoder, "launch", counting)
    for pipelined, ahead in ((True, 1), (False, 0)):
        engine.pipelined = pipelined
        launched.clear()
        request = GenerationRequest(PROMPTS[1], 12, ignore_eos=True, reuse=False)
        seen = [
            (event.index, len(launched))
            for event in engine.generate(request, SpecControl(True, 3))
            if isinstance(event, StepEvent)
        ]
        # pipelined: when decode step i is handed on, step i + 1 is already launched (not after the
        # first token, which goes out at once, nor after the last)
        assert seen[0] == (0, 0) and seen[-1][1] == seen[-1][0]
        assert len(seen) > 3 and [n - i for i, n in seen[1:-1]] == [ahead] * (len(seen) - 2), seen


@pytest.mark.parametrize("choice", ["torch", "triton"])  # triton: the block's context is written ahead too
def test_a_stop_string_undoes_the_step_launched_ahead(engine, choice):
    """The follow-up request resumes from exactly what the stopped one left, as without pipelining."""
    first = GenerationRequest(PROMPTS[2], 16, ignore_eos=True, reuse=False)
    results = {}
    with kernels(choice):
        text = run(engine, False, first, SpecControl(True, 15))[-1].text
        assert len(text) > 8
        stop = text[4:8]
        for pipelined in (True, False):
            stopped = run(
                engine,
                pipelined,
                GenerationRequest(PROMPTS[2], 16, ignore_eos=True, reuse=False, stop_strings=(stop,)),
                SpecControl(True, 15),
            )
            assert stopped[-1].finish_reason == "stop" and stop not in stopped[-1].text
            follow = PROMPTS[2] + stopped[-1].token_ids + [7, 8]
            again = run(engine, pipelined, GenerationRequest(follow, 6, ignore_eos=True), SpecControl(True, 15))
            assert again[-1].stats["reused_tokens"] > len(PROMPTS[2])  # the state was left whole
            results[pipelined] = shape(stopped), shape(again)
    assert results[True] == results[False]


def test_closing_the_generation_undoes_the_step_launched_ahead(engine):
    request = GenerationRequest(PROMPTS[0], 40, ignore_eos=True, reuse=False)
    results = {}
    for pipelined in (True, False):
        cut = run(engine, pipelined, request, SpecControl(True, 7), keep=3)
        assert not any(isinstance(e, FinishEvent) for e in cut)
        tokens = [t for e in cut for t in e.emitted]
        follow = PROMPTS[0] + tokens + [9]
        again = run(engine, pipelined, GenerationRequest(follow, 12, ignore_eos=True), SpecControl(True, 7))
        assert again[-1].stats["reused_tokens"] == len(follow) - 2  # all it ran: not the last token, nor 9
        results[pipelined] = shape(cut), shape(again)
    assert results[True] == results[False]


def test_an_abandoned_step_leaves_the_decoder_as_it_was(engine):
    runs = []
    for abandon in (True, False):
        decoder = speculative.Decoder(engine.model, engine.drafter, 96, engine.kv_dtype, SamplingParams(), set())
        decoder.prefill(PROMPTS[1])
        decoder.step(64, SpecControl(True, 15))
        if abandon:
            for control in (SpecControl(True, 7), SpecControl(False)):
                last, length = decoder.last, decoder.cache.length
                decoder.abandon(decoder.launch(64, control))
                assert decoder.last is last and decoder.cache.length == length
                # every position the target ran is in the drafter's context or waits to go in
                assert decoder.ctx.length + sum(t.shape[0] for t in decoder.pending) == length
        steps = [decoder.step(64, SpecControl(k > 0, k)).emitted for k in (15, 0, 5)]
        decoder.flush_pending()
        runs.append((steps, decoder.cache.length, decoder.ctx.length))
    assert runs[0] == runs[1]
