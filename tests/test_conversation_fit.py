"""engine/decode/conversation.py: a conversation into the context, with the tiny Gemma-4 template."""

from __future__ import annotations

import pytest

from flashdesk.engine.decode.chat_format import build_prompt_ids, load_tokenizer
from flashdesk.engine.decode.conversation import DROP_OLDEST, STOP, fit_conversation, reply_room
from flashdesk.engine.errors import ContextOverflowError
from tiny_tokenizer import write_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fit_tok")
    write_tokenizer(folder)
    return load_tokenizer(folder)


def conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "you are terse"}]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"question {i} " + "cat " * 20},
            {"role": "assistant", "content": f"answer {i} " + "dog " * 20},
        ]
    return messages + [{"role": "user", "content": "last question " + "sun " * 10}]


def length(tok, messages) -> int:
    return len(build_prompt_ids(tok, messages, enable_thinking=False))


def test_a_conversation_that_fits_is_left_whole_and_the_reply_capped_to_the_room(tok):
    messages = conversation(2)
    n = length(tok, messages)
    fitted = fit_conversation(tok, messages, thinking=False, context_limit=2 * n, max_new_tokens=n + 50)
    assert fitted.dropped == 0 and fitted.messages == messages and len(fitted.ids) == n
    assert fitted.max_new_tokens == n and fitted.capped  # what the context leaves
    assert fitted.finish_reason("length", n) == "context"  # the reply filled the context
    assert fitted.finish_reason("stop", 40) == "stop"
    roomy = fit_conversation(tok, messages, thinking=False, context_limit=2 * n, max_new_tokens=n // 2)
    assert roomy.max_new_tokens == n // 2 and not roomy.capped and roomy.finish_reason("length", n // 2) == "length"
    # a conversation over 3/4 of the context leaves the reply too little: its oldest turn goes
    assert fit_conversation(tok, messages, thinking=False, context_limit=n + 20, max_new_tokens=n).dropped >= 2


def test_drop_oldest_drops_whole_turns_keeping_the_system_prompt_and_the_last_message(tok):
    messages = conversation(6)
    full = length(tok, messages)
    limit = full // 2
    fitted = fit_conversation(tok, messages, thinking=False, context_limit=limit, max_new_tokens=64)
    assert fitted.dropped > 0 and fitted.dropped % 2 == 0  # user + assistant pairs
    assert fitted.messages[0] == messages[0] and fitted.messages[1]["role"] == "user"
    assert fitted.messages[-1] == messages[-1]
    allowed = limit - reply_room(limit, 64)
    assert len(fitted.ids) <= allowed // 2  # down to half, so the next turns do not drop again
    more = [messages[0]] + messages[1 + fitted.dropped - 2 :]  # the fewest turns: one fewer is too many
    assert length(tok, more) > allowed // 2


def test_the_stop_policy_refuses_with_the_numbers_and_the_way_on(tok):
    messages = conversation(6)
    with pytest.raises(ContextOverflowError, match=r"over the context of 200 tokens: start a new conversation"):
        fit_conversation(tok, messages, thinking=False, context_limit=200, max_new_tokens=64, policy=STOP)


def test_a_last_message_too_long_for_the_context_is_refused_under_either_policy(tok):
    messages = [{"role": "user", "content": "word " * 400}]
    for policy in (DROP_OLDEST, STOP):
        with pytest.raises(ContextOverflowError, match="context of 128 tokens"):
            fit_conversation(tok, messages, thinking=False, context_limit=128, max_new_tokens=16, policy=policy)


def test_bad_settings_are_named(tok):
    with pytest.raises(ValueError, match="unknown context policy 'truncate'"):
        fit_conversation(tok, conversation(1), thinking=False, context_limit=512, max_new_tokens=8, policy="truncate")
    with pytest.raises(ValueError, match="at least 1"):
        fit_conversation(tok, conversation(1), thinking=False, context_limit=512, max_new_tokens=0)


# -- going on with a reply the context cut off -------------------------------------------------------------


def test_messages_ending_with_a_reply_continue_it_without_a_generation_prompt(tok):
    """The reply's turn is left open: the prompt is the template's up to the reply's last character,
    and a new turn's generation prompt is not in it (transformers' continue_final_message)."""
    messages = conversation(1)[:-1]
    ids = build_prompt_ids(tok, messages, enable_thinking=False)
    text = tok.decode(ids)
    assert text.endswith(messages[-1]["content"].rstrip()) and "<turn|>" not in text.split("<|turn>model")[-1]
    expected = tok.apply_chat_template(messages, continue_final_message=True, tokenize=True, enable_thinking=False)
    assert ids == list(expected["input_ids"] if hasattr(expected, "keys") else expected)


def test_a_continued_reply_drops_older_turns_first_then_the_start_of_the_reply(tok):
    messages = conversation(3)[:-1]  # ends with the third answer: the reply to go on with
    n = length(tok, messages)
    fitted = fit_conversation(tok, messages, thinking=False, context_limit=n, max_new_tokens=64)
    assert fitted.dropped == 4 and fitted.cut_chars == 0  # two whole turns go; the reply stays whole
    assert fitted.messages[0] == messages[0] and fitted.messages[-2:] == messages[-2:]

    long_reply = {"role": "assistant", "content": "\n".join(f"line {i} of the story, " + "owl " * 8 for i in range(40))}
    alone = [messages[0], messages[1], long_reply]
    whole = length(tok, alone)
    fitted = fit_conversation(tok, alone, thinking=False, context_limit=whole, max_new_tokens=64)
    allowed = whole - reply_room(whole, 64)
    kept = fitted.messages[-1]["content"]
    assert fitted.dropped == 0 and fitted.messages[:2] == alone[:2]  # the question stays
    assert fitted.cut_chars > 0 and kept == long_reply["content"][fitted.cut_chars :]
    assert long_reply["content"][fitted.cut_chars - 1] == "\n"  # it begins at a line
    assert len(fitted.ids) <= allowed // 2 + 1 and fitted.max_new_tokens == 64


def test_a_continued_reply_whose_question_alone_overflows_is_refused(tok):
    messages = [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "and so"}]
    with pytest.raises(ContextOverflowError, match="last message alone"):
        fit_conversation(tok, messages, thinking=False, context_limit=256, max_new_tokens=64)
