"""Structured output (issue 34 item 2): a grammar masks every sampled position, and speculation stays
exact under it. Greedy output with DFlash or MTP drafting equals greedy output without speculation
for the same schema, sampled output stays within the grammar, and the matcher is rolled back to the
accepted tokens at every step."""

from __future__ import annotations

import json

import pytest
import torch

from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest, StepEvent
from flashdesk.engine.decode.grammar import json_grammar
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.speculative import SpecControl
from tiny_assistant import write_echo_assistant
from tiny_drafter import PROMPTS

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "size": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "bc", "the"]}, "maxItems": 3},
    },
    "required": ["name", "size", "ok", "tags"],
    "additionalProperties": False,
}


def matches(value, schema: dict) -> bool:
    """Whether `value` fits SCHEMA's kind of schema (the few keywords it uses)."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema["type"]
    if kind == "object":
        props = schema["properties"]
        return (
            isinstance(value, dict)
            and set(schema["required"]) <= set(value) <= set(props)
            and all(matches(v, props[k]) for k, v in value.items())
        )
    if kind == "array":
        return (
            isinstance(value, list)
            and len(value) <= schema.get("maxItems", len(value))
            and all(matches(v, schema["items"]) for v in value)
        )
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "integer":
        return type(value) is int and schema["minimum"] <= value <= schema["maximum"]
    return kind == "boolean" and isinstance(value, bool)


@pytest.fixture(scope="module")
def engines(spec_pair, tmp_path_factory):
    """{"dflash": the trained pair's engine, "mtp": its target with an assistant}."""
    from flashdesk.engine.decode.generation import Engine

    engine, (target_dir, _), reference, _ = spec_pair
    assistant_dir = tmp_path_factory.mktemp("structured-assistant")
    write_echo_assistant(assistant_dir, reference, seed=4)
    return {"dflash": engine, "mtp": Engine.load(target_dir, device="cpu", draft_dir=assistant_dir)}


def run(engine, prompt, control, sampling=SamplingParams(), max_new=80, schema=SCHEMA):
    request = GenerationRequest(prompt, max_new, sampling, grammar=json_grammar(schema))
    events = list(engine.generate(request, control))
    steps = [e for e in events if isinstance(e, StepEvent) and e.index > 0]
    return events[-1], steps


def reply(engine, finish: FinishEvent):
    """The reply's JSON (the <turn|> that ended it is not part of it)."""
    return json.loads(engine.tokenizer.decode(finish.token_ids[:-1]))


@pytest.mark.parametrize("method", ["dflash", "mtp"])
@pytest.mark.parametrize("prompt", PROMPTS[:2], ids=["chat", "short"])
def test_greedy_output_under_a_schema_is_the_same_with_speculation(engines, method, prompt):
    engine = engines[method]
    plain, _ = run(engine, prompt, SpecControl(enabled=False))
    assert plain.finish_reason == "stop" and plain.token_ids[-1] == 106  # the grammar's end: <turn|> only
    assert matches(reply(engine, plain), SCHEMA)
    rejected = 0
    for k in (1, 3, 8, 15):
        spec, steps = run(engine, prompt, SpecControl(True, k, method))
        assert spec.token_ids == plain.token_ids, k
        assert steps and all(s.method == method and len(s.draft) <= k for s in steps)
        rejected += sum(s.accepted < len(s.draft) for s in steps)
    assert rejected  # some drafts were refused, so the matcher was rolled back


@pytest.mark.parametrize("method", ["dflash", "mtp"])
def test_sampled_output_with_speculation_stays_within_the_grammar(engines, method):
    engine = engines[method]
    for seed in range(4):
        sampling = SamplingParams(temperature=1.0, top_p=0.95, seed=seed)
        finish, steps = run(engine, PROMPTS[0], SpecControl(True, 6, method), sampling)
        assert finish.finish_reason == "stop", seed
        assert matches(reply(engine, finish), SCHEMA), seed
        assert sum(s.accepted for s in steps) > 0


def test_sampling_under_a_schema_is_seeded_and_the_same_with_a_plain_step_each_time(engines):
    """Seeded sampling repeats itself under a grammar, and a plain step's masked sample is the one
    the grammar allows (every emitted prefix is a prefix of a sentence of the grammar)."""
    engine = engines["dflash"]
    sampling = SamplingParams(temperature=0.8, seed=11)
    first, _ = run(engine, PROMPTS[1], SpecControl(enabled=False), sampling)
    again, _ = run(engine, PROMPTS[1], SpecControl(enabled=False), sampling)
    assert first.token_ids == again.token_ids
    assert matches(reply(engine, first), SCHEMA)


def test_the_matcher_holds_exactly_the_emitted_tokens_after_every_step(engines):
    """Drafts consumed by a step's walk are taken back to the accepted ones: after each step the
    matcher accepts the emitted tokens so far and nothing more (a fresh matcher fed them agrees)."""
    engine = engines["mtp"]
    grammar = json_grammar(SCHEMA)
    seen = []
    original = engine.grammar_state

    def watched(g):
        state = original(g)
        seen.append(state)
        return state

    engine.grammar_state = watched
    try:
        tokens = []
        for event in engine.generate(GenerationRequest(PROMPTS[0], 60, grammar=grammar), SpecControl(True, 5, "mtp")):
            if isinstance(event, FinishEvent):
                break
            tokens += event.emitted
            fresh = original(grammar)
            kept = [t for t in tokens if t not in fresh.end_ids]  # the end token is no part of the history
            assert all(fresh.consume(t) for t in kept)
            assert torch.equal(fresh.bitmask(), seen[0].bitmask()), event.index
    finally:
        del engine.grammar_state


def test_a_schema_the_library_cannot_compile_is_said_plainly():
    from flashdesk.engine.decode.grammar import check

    assert "bogus" in check(json_grammar({"type": "bogus"}))
    assert check(json_grammar(SCHEMA)) == ""


@pytest.fixture(scope="module")
def demo_engine(tmp_path_factory):
    from flashdesk.engine.decode.generation import Engine
    from flashdesk.engine.hub.demo import create_demo

    target, drafter = create_demo(tmp_path_factory.mktemp("structured-demo"))
    return Engine.load(target, device="cpu", draft_dir=drafter)


def _json_prompt_ids(engine, item) -> list[int]:
    from flashdesk.engine.decode.chat_format import build_prompt_ids, messages_from

    return build_prompt_ids(engine.tokenizer, messages_from(item["prompt"]), enable_thinking=False)


def test_the_bench_json_prompts_decode_the_same_with_speculation_on_the_demo_pair(demo_engine):
    """The demo pair under the bench's schemas: its drafter is far from the grammar (most of its
    choices are refused and masked), and the target's choices are checked against masks on the
    host; every greedy reply, and its logprobs, equal plain decoding's."""
    from flashdesk.engine.bench.prompts import task_prompts

    for item in task_prompts("json")[:6]:
        ids = _json_prompt_ids(demo_engine, item)

        def decode(control):
            request = GenerationRequest(ids, 48, grammar=json_grammar(item["schema"]), logprobs=0)
            events = list(demo_engine.generate(request, control))
            logprobs = [t.logprob for e in events if isinstance(e, StepEvent) and e.logprobs for t in e.logprobs]
            return events[-1].token_ids, logprobs

        plain, plain_logprobs = decode(SpecControl(enabled=False))
        for k in (4, 15):
            spec, logprobs = decode(SpecControl(True, k))
            assert spec == plain, (item["prompt"][:40], k)
            assert logprobs == pytest.approx(plain_logprobs, abs=1e-4)


def test_greedy_output_under_a_schema_with_penalties_and_suppressed_tokens_is_the_same_with_speculation(demo_engine):
    """The host's verification with the sampling's penalties and suppressed tokens on the target's
    rows (a token plain decoding would pick is suppressed): each reply equals plain decoding's."""
    from flashdesk.engine.bench.prompts import task_prompts
    from flashdesk.engine.decode.grammar import GrammarError

    for item in task_prompts("json")[6:9]:
        ids, grammar = _json_prompt_ids(demo_engine, item), json_grammar(item["schema"])
        first = list(demo_engine.generate(GenerationRequest(ids, 40, grammar=grammar), SpecControl(False)))[-1]
        state, free_tokens = demo_engine.grammar_state(grammar), []
        for token in first.token_ids[:-1]:  # the tokens chosen where the grammar forced no byte
            if state.forced() is None and state.free():
                free_tokens.append(token)
            state.consume(token)
        for token in reversed(free_tokens):  # one whose suppression leaves the reply a choice at every step
            sampling = SamplingParams(repetition_penalty=1.3, presence_penalty=0.4, suppress=(token,))
            request = GenerationRequest(ids, 40, sampling, grammar=grammar)
            try:
                plain = list(demo_engine.generate(request, SpecControl(False)))
            except GrammarError:  # the grammar later forces it: no reply without it
                continue
            break
        else:
            pytest.fail("every token chosen at a free state is forced later in the reply")
        assert plain[-1].token_ids != first.token_ids
        for k in (4, 15):
            request = GenerationRequest(ids, 40, sampling, grammar=grammar)
            assert list(demo_engine.generate(request, SpecControl(True, k)))[-1].token_ids == plain[-1].token_ids, k


def test_the_mask_is_the_rule_a_forced_token_is_all_it_allows_and_a_free_state_masks_nothing_it_takes(demo_engine):
    """Three facts of llguidance the constrained greedy step relies on, checked along real replies
    over the whole vocabulary: its matcher takes some tokens its mask leaves out (a string's closing
    quote alone, where the mask keeps only the quote joined to what follows), so a choice is checked
    against the mask, not by whether the matcher takes it; where it reports a forced token, the
    mask allows that token alone, so a forced row needs no mask; and where it forces no byte at all
    (`free`), the mask is exactly the tokens the matcher takes, so a free row needs none either
    (the end token aside: it is allowed where the grammar may end)."""
    import numpy as np

    from flashdesk.engine.bench.prompts import task_prompts

    from flashdesk.engine.decode.grammar import lark
    from flashdesk.engine.decode.tool_calls import Markers, call_grammar

    items = task_prompts("json")[:4]
    tool = {"name": "note", "parameters": {"type": "object", "properties": items[0]["schema"]["properties"]}}
    call = lark(call_grammar([tool], Markers.of(demo_engine.tokenizer)))  # control tokens, %json numbers
    cases = [(_json_prompt_ids(demo_engine, item), json_grammar(item["schema"])) for item in items]
    taken_not_masked = forced_rows = free_rows = 0
    for ids, grammar in cases + [(cases[0][0], call)]:
        request = GenerationRequest(ids, 48, grammar=grammar)
        reply = list(demo_engine.generate(request, SpecControl(enabled=False)))[-1].token_ids
        state = demo_engine.grammar_state(grammar)
        for token in reply[:-1]:
            bitmask = state.bitmask()
            allowed = set(np.flatnonzero(np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")).tolist())
            taken = {t for t in range(4096) if t not in state.end_ids and state.valid(t)}
            assert allowed - state.end_ids <= taken
            forced = state.forced()
            if forced is not None:
                forced_rows += 1
                assert allowed == {forced}
            if state.free():
                free_rows += 1
                assert allowed - state.end_ids == taken
            taken_not_masked += len(taken - allowed)
            assert token in allowed and state.consume(token)
    assert taken_not_masked and forced_rows > 20 and free_rows > 20


def test_a_forced_token_the_sampling_suppresses_ends_the_reply_with_an_error_either_way(demo_engine):
    """Where the grammar allows one token and the sampling never emits it (suppress_tokens), no
    token can be chosen: plain decoding and speculation both stop with a GrammarError, rather than
    emitting a token outside the grammar."""
    from flashdesk.engine.bench.prompts import task_prompts
    from flashdesk.engine.decode.grammar import GrammarError

    item = task_prompts("json")[0]
    ids, grammar = _json_prompt_ids(demo_engine, item), json_grammar(item["schema"])
    reply = list(demo_engine.generate(GenerationRequest(ids, 24, grammar=grammar), SpecControl(False)))[-1]
    state = demo_engine.grammar_state(grammar)
    forced = None
    for token in reply.token_ids:
        if state.forced() is not None and token > 300:  # past the opening brace and quote
            forced = token
            break
        state.consume(token)
    assert forced is not None
    sampling = SamplingParams(suppress=(forced,))
    for control in (SpecControl(False), SpecControl(True, 4), SpecControl(True, 15)):
        with pytest.raises(GrammarError, match="no token it allows could be chosen"):
            list(demo_engine.generate(GenerationRequest(ids, 24, sampling, grammar=grammar), control))


def test_a_draft_the_matcher_refuses_takes_its_next_candidate_and_a_mask_only_where_none_is_taken(demo_engine):
    """Constrained greedy drafting: where the matcher refuses a row's argmax, the row's likeliest
    candidate it takes is drafted with no mask computed (the verification masks the rows it
    reaches); only where it takes none of the candidates is the row masked, for its masked argmax."""
    import numpy as np

    from flashdesk.engine.bench.prompts import task_prompts
    from flashdesk.engine.decode.guided_greedy import DRAFT_CANDIDATES, draft_tokens

    item = task_prompts("json")[0]
    grammar = json_grammar(item["schema"])
    request = GenerationRequest(_json_prompt_ids(demo_engine, item), 24, grammar=grammar)
    reply = list(demo_engine.generate(request, SpecControl(enabled=False)))[-1].token_ids
    state = demo_engine.grammar_state(grammar)
    for token in reply:  # up to the first state that forces nothing
        if state.forced() is None:
            break
        state.consume(token)
    masks = []
    bitmask = state.bitmask
    state.bitmask = lambda: masks.append(1) or bitmask()  # type: ignore[method-assign]
    refused = [t for t in range(4096) if not state.valid(t)]
    allowed = np.flatnonzero(np.unpackbits(bitmask().numpy().view(np.uint8), bitorder="little"))

    logits = torch.zeros(1, 4096)
    logits[0, refused[:2]] = torch.tensor([3.0, 2.0])
    logits[0, allowed[-1]] = 1.0  # the third candidate
    walk = state.walk()
    assert draft_tokens(logits.topk(DRAFT_CANDIDATES).indices.tolist(), logits, walk) == [allowed[-1]]
    assert not masks
    walk.undo()

    logits[0, refused[:DRAFT_CANDIDATES]] = torch.arange(DRAFT_CANDIDATES, 0, -1, dtype=torch.float) + 1
    walk = state.walk()
    assert draft_tokens(logits.topk(DRAFT_CANDIDATES).indices.tolist(), logits, walk) == [allowed[-1]]
    assert len(masks) == 1
    walk.undo()


def test_a_constrained_draft_stops_walking_where_the_drafter_has_lost_the_grammar(demo_engine):
    """After LOST_ROWS rows where the matcher takes none of the candidates (each masked for its
    masked argmax), the walk stops: the rest stay as proposed, unwalked, and none is accepted."""
    from flashdesk.engine.bench.prompts import task_prompts
    from flashdesk.engine.decode.guided_greedy import DRAFT_CANDIDATES, LOST_ROWS, draft_tokens

    item = task_prompts("json")[0]
    grammar = json_grammar(item["schema"])
    request = GenerationRequest(_json_prompt_ids(demo_engine, item), 24, grammar=grammar)
    reply = list(demo_engine.generate(request, SpecControl(enabled=False)))[-1].token_ids
    state = demo_engine.grammar_state(grammar)
    for token in reply:  # into the first state that forces nothing
        if state.forced() is None:
            break
        state.consume(token)
    chosen, refused = [], []  # at each state the walk passes: a token the matcher takes, and four it refuses
    for _ in range(LOST_ROWS + 1):
        chosen.append(next(t for t in range(4096) if t not in state.end_ids and state.valid(t)))
        refused.append([t for t in range(4096) if not state.valid(t)][:DRAFT_CANDIDATES])
        assert state.consume(chosen[-1])
    state.rollback(LOST_ROWS + 1)
    masks = []
    bitmask = state.bitmask
    state.bitmask = lambda: masks.append(1) or bitmask()  # type: ignore[method-assign]
    logits = torch.zeros(LOST_ROWS + 2, 4096)
    for row, (good, bad) in enumerate(zip(chosen, refused)):
        logits[row, bad] = torch.arange(DRAFT_CANDIDATES, 0, -1, dtype=torch.float) + 1
        logits[row, good] = 1.0
    walk = state.walk()
    draft = draft_tokens(logits.topk(DRAFT_CANDIDATES).indices.tolist(), logits, walk)
    assert len(masks) == LOST_ROWS and walk.consumed == LOST_ROWS and len(walk.forced) == LOST_ROWS + 1
    assert draft[:LOST_ROWS] == chosen[:LOST_ROWS] and draft[LOST_ROWS] == refused[LOST_ROWS][0]
    walk.undo()
