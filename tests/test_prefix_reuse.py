"""Prefix reuse across requests (engine/decode/prefix_cache.py): every reply equals the reply of a
fresh prefill, token for token, while only the new part of each prompt is prefilled; through
follow-ups, regenerate, an edit, switching conversations, a cancel, a failure and a zero budget."""

from __future__ import annotations

import pytest
import torch

from flashdesk.engine.decode import speculative
from flashdesk.engine.decode.chat_format import build_prompt_ids
from flashdesk.engine.decode.generation import Engine, FinishEvent, GenerationRequest
from flashdesk.engine.decode.prefix_cache import PrefixCache, common_prefix
from flashdesk.engine.decode.speculative import SpecControl
from flashdesk.engine.model.kv_cache import ring_keeps

WORDS = "the a cat dog sat on mat and then ran far away over hill to see sun moon star".split()


def sentence(seed: int, n: int) -> str:
    g = torch.Generator().manual_seed(seed)
    return " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (n,), generator=g).tolist())


@pytest.fixture(scope="module")
def engine(spec_pair):
    target_dir, draft_dir = spec_pair[1]
    return Engine.load(target_dir, device="cpu", draft_dir=draft_dir)


def run(engine, prompt, n=24, reuse=True, control=None, ignore_eos=True):
    *_, finish = engine.generate(GenerationRequest(prompt, n, ignore_eos=ignore_eos, reuse=reuse), control)
    assert isinstance(finish, FinishEvent)
    return finish


def fresh(engine, prompt, n=24, control=None):
    """The reference: the same request prefilled from scratch (and the cache left as before it)."""
    saved = engine._prefix
    engine._prefix, engine._cache, engine._ctx = None, None, None
    try:
        return run(engine, prompt, n, reuse=False, control=control)
    finally:
        engine._prefix = saved
        if saved is not None:
            engine._cache, engine._ctx = saved.cache, saved.ctx


def prompt_of(engine, messages, thinking=False):
    return build_prompt_ids(engine.tokenizer, messages, enable_thinking=thinking)


def reply_text(engine, finish):
    return engine.tokenizer.decode(finish.token_ids, skip_special_tokens=True) or "ok"


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("control", [SpecControl(True, None), SpecControl(False)], ids=["dflash", "plain"])
def test_a_conversation_prefills_only_each_turns_new_tokens(engine, thinking, control):
    messages = [{"role": "system", "content": "be brief"}]
    previous: list[int] = []
    for turn in range(4):
        user = sentence(turn, 12)
        messages.append({"role": "user", "content": user})
        prompt = prompt_of(engine, messages, thinking)
        got = run(engine, prompt, 24, control=control)
        want = fresh(engine, prompt, 24, control=control)
        assert got.token_ids == want.token_ids, turn
        s = got.stats
        assert s["reused_tokens"] + s["prefill_tokens"] == len(prompt)
        if turn:  # everything up to the last reply is reused, but the empty thought the template drops
            assert s["reused_tokens"] >= len(previous) - 4, (s, len(previous))
            assert s["prefill_tokens"] <= len(prompt) - len(previous) + 4
        messages.append({"role": "assistant", "content": reply_text(engine, got)})
        previous = prompt


def test_regenerate_reuses_all_but_the_last_prompt_token_and_repeats_the_reply(engine):
    prompt = prompt_of(engine, [{"role": "user", "content": sentence(10, 30)}])
    first = run(engine, prompt, 40)  # far past the rings' slack: the snapshot at the prompt's end is needed
    again = run(engine, prompt, 40)
    assert again.stats["reused_tokens"] == len(prompt) - 1 and again.stats["prefill_tokens"] == 1
    assert again.token_ids == first.token_ids == fresh(engine, prompt, 40).token_ids


def test_an_edited_last_message_resumes_at_the_previous_prompts_end(engine):
    messages = [{"role": "user", "content": sentence(20, 10)}]
    first = run(engine, prompt_of(engine, messages), 30)
    messages.append({"role": "assistant", "content": reply_text(engine, first)})
    previous = prompt_of(engine, messages + [{"role": "user", "content": sentence(21, 10)}])
    run(engine, previous, 30)
    edited = prompt_of(engine, messages + [{"role": "user", "content": sentence(22, 14)}])
    got = run(engine, edited, 30)
    # the edit diverges long after the first prompt's end (the rings moved on) and long before the
    # second's (too far back from it): the first prompt's snapshot is the way back
    assert len(prompt_of(engine, messages[:1])) - 4 <= got.stats["reused_tokens"] < common_prefix(previous, edited)
    assert got.token_ids == fresh(engine, edited, 30).token_ids


def test_switching_between_conversations_resumes_each_from_host_memory(engine):
    convs = {
        name: [{"role": "system", "content": name}, {"role": "user", "content": sentence(seed, 15)}]
        for name, seed in (("alpha", 30), ("beta", 31))
    }
    previous = {}
    for turn in range(3):
        for name, messages in convs.items():
            prompt = prompt_of(engine, messages)
            got = run(engine, prompt, 20)
            assert got.token_ids == fresh(engine, prompt, 20).token_ids
            if turn:  # resumed where its last reply began, though the other one ran in between
                assert got.stats["reused_tokens"] >= len(previous[name]) - 4, (name, turn, got.stats)
            previous[name] = prompt
            messages += [
                {"role": "assistant", "content": reply_text(engine, got)},
                {"role": "user", "content": sentence(40 + turn, 6)},
            ]
    assert engine._prefix.kept and engine._prefix.host_bytes() <= engine._prefix.budget


def test_the_least_recently_used_conversation_leaves_host_memory_first(engine):
    saved = engine._step_state()
    engine._prefix = PrefixCache(saved.cache, saved.ctx)
    try:
        prompts = {
            name: prompt_of(
                engine, [{"role": "system", "content": name}, {"role": "user", "content": sentence(len(name), 12)}]
            )
            for name in ("a", "bb", "ccc")
        }
        for prompt in prompts.values():
            run(engine, prompt, 20)
        cache = engine._prefix
        assert [s.tokens[: len(prompts[n])] for s, n in zip(cache.kept, ("a", "bb"))] == [prompts["a"], prompts["bb"]]
        cache.budget = cache.host_bytes() - 1
        cache._fit_budget()
        assert len(cache.kept) == 1 and cache.active.snapshots  # "a" went, not the newer ones
        assert engine.reusable_tokens(prompts["a"]) < 8  # the <bos> and the system turn's opening at most
        assert engine.reusable_tokens(prompts["bb"]) == len(prompts["bb"]) - 1
        assert run(engine, prompts["bb"], 20).token_ids == fresh(engine, prompts["bb"], 20).token_ids
    finally:
        engine._prefix = saved


def test_without_a_host_budget_only_the_live_state_is_reused_and_output_is_unchanged(engine):
    saved = engine._step_state()
    engine._prefix = PrefixCache(saved.cache, saved.ctx, budget=0)
    try:
        prompt = prompt_of(engine, [{"role": "user", "content": sentence(50, 20)}])
        first = run(engine, prompt, 40)
        again = run(engine, prompt, 40)  # the rings moved on: nothing to resume from
        assert again.stats["reused_tokens"] == 0 and again.token_ids == first.token_ids
        assert engine._prefix.host_bytes() == 0
    finally:
        engine._prefix = saved


def test_a_cancelled_reply_leaves_a_state_the_next_turn_continues(engine):
    messages = [{"role": "user", "content": sentence(60, 12)}]
    prompt = prompt_of(engine, messages)
    events = engine.generate(GenerationRequest(prompt, 60, ignore_eos=True))
    ids = []
    for event in events:
        ids += event.emitted
        if event.index == 3:
            events.close()  # what the worker does on a cancel
            break
    messages += [
        {"role": "assistant", "content": engine.tokenizer.decode(ids, skip_special_tokens=True)},
        {"role": "user", "content": sentence(61, 8)},
    ]
    follow = prompt_of(engine, messages)
    got = run(engine, follow, 20)
    assert got.stats["reused_tokens"] > len(prompt) - 17
    assert got.token_ids == fresh(engine, follow, 20).token_ids


def test_a_failed_step_makes_the_next_request_start_afresh(engine, monkeypatch):
    prompt = prompt_of(engine, [{"role": "user", "content": sentence(70, 12)}])
    run(engine, prompt, 10)

    original, calls = speculative.Decoder.finish, []

    def broken(self, flight):  # the second step's device error surfaces at its read
        calls.append(flight)
        if len(calls) % 2 == 0:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return original(self, flight)

    monkeypatch.setattr(speculative.Decoder, "finish", broken)
    for pipelined in (False, True):
        engine.pipelined = pipelined
        with pytest.raises(RuntimeError, match="illegal memory"):
            run(engine, prompt, 10)
    engine.pipelined = False
    monkeypatch.undo()
    got = run(engine, prompt, 10)
    assert got.stats["reused_tokens"] == 0  # the cache's content was unknown: nothing was trusted
    assert got.token_ids == fresh(engine, prompt, 10).token_ids


def test_reusable_tokens_predicts_what_the_next_request_reuses(engine):
    prompt = prompt_of(engine, [{"role": "user", "content": sentence(80, 12)}])
    run(engine, prompt, 10)
    longer = prompt + prompt_of(engine, [{"role": "user", "content": "and then"}])[1:]
    predicted = engine.reusable_tokens(longer)
    assert predicted > 0
    assert run(engine, longer, 5).stats["reused_tokens"] == predicted


def test_ring_keeps_the_window_only_while_the_slack_allows():
    # window 8, ring of 8 + 16 slots: written up to 40, a query at 23 needs 16..22, slots of 16.. hold them
    assert ring_keeps(23, 40, 24, 8) and not ring_keeps(22, 40, 24, 8)
    assert ring_keeps(0, 24, 24, 8)  # never wrapped: everything is there
    assert ring_keeps(3, 10_000, 24, None)  # a full layer keeps every position


def test_the_triton_path_resumes_the_same_way(engine):
    """In-place ring attention and draft blocks written past the held length (the GPU path), under
    the interpreter: a follow-up resumed from a snapshot equals a fresh prefill."""
    from flashdesk.kernels.backend import kernels

    with kernels("triton"):
        messages = [{"role": "user", "content": sentence(90, 6)}]
        first = run(engine, prompt_of(engine, messages), 20)  # past the rings' slack: a snapshot is needed
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": sentence(91, 4)}]
        follow = prompt_of(engine, messages)
        got = run(engine, follow, 10)  # (the interpreter is slow: enough tokens for a draft block)
        assert got.stats["reused_tokens"] >= first.stats["prompt_tokens"] - 4
        assert got.token_ids == fresh(engine, follow, 10).token_ids


def test_a_scope_never_resumes_another_scopes_conversation(engine):
    """Two API keys' requests (prefix_cache.py's scopes): the same prompt from another scope prefills
    from scratch, and neither its reuse nor its prediction says how much another scope left."""
    prompt = prompt_of(engine, [{"role": "user", "content": sentence(96, 12)}])
    *_, first = engine.generate(GenerationRequest(prompt, 8, ignore_eos=True, scope="key:a"))
    longer = prompt + first.token_ids[:-1] + prompt_of(engine, [{"role": "user", "content": "and then"}])[1:]
    assert engine.reusable_tokens(longer, "key:a") > 0
    assert engine.reusable_tokens(longer, "key:b") == 0
    *_, other = engine.generate(GenerationRequest(longer, 8, ignore_eos=True, scope="key:b"))
    assert other.stats["reused_tokens"] == 0
    assert other.token_ids == fresh(engine, longer, 8).token_ids
    *_, own = engine.generate(GenerationRequest(longer, 8, ignore_eos=True, scope="key:a"))
    assert own.stats["reused_tokens"] >= len(prompt) - 1  # its own, back from host memory
    assert own.token_ids == other.token_ids


def test_two_kept_conversations_with_the_same_tokens_resume_each_by_identity(engine):
    """Two scopes' conversations with equal tokens, both kept in host memory: resuming the second
    takes that very one out of the keep list (it compared the two by value, tensors included, and
    every later request of that scope failed with "Boolean value of Tensor ... is ambiguous")."""
    prompt = prompt_of(engine, [{"role": "user", "content": sentence(97, 10)}])
    other = prompt_of(engine, [{"role": "user", "content": sentence(98, 10)}])
    for scope in ("key:a", "key:b"):  # the same greedy reply in two scopes
        *_, first = engine.generate(GenerationRequest(prompt, 8, ignore_eos=True, scope=scope))
    list(engine.generate(GenerationRequest(other, 8, ignore_eos=True, scope="key:c")))  # both kept now
    for _ in range(2):
        *_, again = engine.generate(GenerationRequest(prompt, 8, ignore_eos=True, scope="key:b"))
        assert again.stats["reused_tokens"] >= len(prompt) - 1 and again.token_ids == first.token_ids


def test_a_failure_while_resuming_forgets_the_kept_conversations_not_the_engine(engine, monkeypatch):
    """If the prefix cache fails to place a request, its bookkeeping is dropped (nothing kept is
    trusted) and the next request prefills from scratch with the same output."""
    prompt = prompt_of(engine, [{"role": "user", "content": sentence(99, 10)}])
    expected = run(engine, prompt, 8)

    def broken(self, *args, **kwargs):
        raise RuntimeError("bookkeeping broke")

    monkeypatch.setattr(PrefixCache, "start", broken)
    with pytest.raises(RuntimeError, match="bookkeeping broke"):
        run(engine, prompt, 8)
    monkeypatch.undo()
    got = run(engine, prompt, 8)
    assert got.stats["reused_tokens"] == 0 and got.token_ids == expected.token_ids
