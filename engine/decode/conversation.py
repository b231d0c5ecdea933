"""A conversation into the context: the prompt ids, the room left for the reply, and what to do
when the conversation has outgrown the context (drop its oldest turns, or stop with a message).

Torch-free: the chat CLI and the worker both fit messages here before asking the engine, so a
full context never reaches the engine as an overflow, and both say the same thing about it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flashdesk.engine.decode.chat_format import build_prompt_ids
from flashdesk.engine.errors import ContextOverflowError, FlashDeskError

DROP_OLDEST = "drop_oldest"  # the default: forget the oldest turns, keep the system prompt
STOP = "stop"  # refuse the turn with a clear message; the user starts a new conversation
CONTEXT_POLICIES = (DROP_OLDEST, STOP)
REPLY_SHARE = 4  # a turn always leaves the reply at least 1/4 of the context (or max new tokens)


@dataclass(frozen=True)
class FittedPrompt:
    ids: list[int]  # the prompt, chat template applied
    messages: list[dict]  # the messages it was built from (the oldest turns gone if dropped)
    dropped: int  # messages dropped from the front (after the system prompt)
    max_new_tokens: int  # what was asked, capped to the room the context leaves
    capped: bool  # max_new_tokens was cut to fit: a reply of that length stopped at the context's end
    cut_chars: int = 0  # a reply being continued: characters of its start left out to fit

    def finish_reason(self, reason: str, generated: int) -> str:
        """The engine's finish reason, or "context" when the reply filled the context."""
        if reason == "length" and self.capped and generated >= self.max_new_tokens:
            return "context"
        return reason


def reply_room(context_limit: int, max_new_tokens: int) -> int:
    """The room a turn must leave for its reply."""
    return max(1, min(max_new_tokens, context_limit // REPLY_SHARE))


def check_policy(policy: str) -> str:
    if policy not in CONTEXT_POLICIES:
        raise ValueError(f"unknown context policy {policy!r}: use {' or '.join(CONTEXT_POLICIES)}")
    return policy


def _turn_starts(messages: list[dict], first: int) -> list[int]:
    """Indices after the system prompt where a user turn begins: the places a conversation can be cut."""
    return [i for i in range(first, len(messages)) if messages[i].get("role") == "user"]


def check_messages(messages: list[dict]) -> None:
    """Refuse messages the chat template cannot take: each a {"role", "content": text} object, its text
    valid Unicode (a lone surrogate, which JSON's \\ud800 escapes can carry, has no UTF-8)."""
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise FlashDeskError(f"message {i} must be an object with a role and a content")
        content = message.get("content")
        if not isinstance(content, str):
            raise FlashDeskError(f"message {i}: content must be text, got {type(content).__name__}")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise FlashDeskError(
                f"message {i} is not valid Unicode: a lone surrogate at character {exc.start}"
            ) from None


def fit_conversation(
    tokenizer: Any,
    messages: list[dict],
    *,
    thinking: bool,
    context_limit: int,
    max_new_tokens: int,
    policy: str = DROP_OLDEST,
    tools: list | None = None,
) -> FittedPrompt:
    """Build the prompt; when it leaves the reply less than `reply_room`, drop the oldest turns
    (keeping the system prompt and the last user message) until it takes at most half of the rest
    (dropping once per many turns, as llama.cpp's context shift does), or, under STOP, refuse.

    Messages ending with an assistant reply continue it (chat_format.build_prompt_ids). That reply
    filled the context once, so when the last turn alone is still too long, the start of the reply
    is left out of the prompt too: the user's message and the reply's latest text are what the
    model needs to go on.

    `tools`: OpenAI's function tools, declared in the system turn (chat_format.build_prompt_ids).

    Raises ContextOverflowError with what to do when even the last message alone does not fit.
    """
    check_policy(policy)
    check_messages(messages)
    if max_new_tokens < 1:
        raise ValueError(f"max new tokens must be at least 1, got {max_new_tokens}")
    room = reply_room(context_limit, max_new_tokens)
    limit = context_limit - room

    def render(kept: list[dict]) -> list[int]:
        return build_prompt_ids(tokenizer, kept, enable_thinking=thinking, tools=tools)

    def build(start: int) -> tuple[list[dict], list[int]]:
        kept = head + messages[start:]
        return kept, render(kept)

    first = 1 if messages and messages[0].get("role") in ("system", "developer") else 0
    head = messages[:first]
    kept, ids = build(first)
    if len(ids) > limit:
        if policy == STOP:
            raise ContextOverflowError(
                f"the conversation is {len(ids)} tokens and its reply needs {room} more, over the context "
                f"of {context_limit} tokens: start a new conversation (the system prompt can be kept), "
                "or choose to drop the oldest turns in Settings"
            )
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages) - 1)
        cuts = _turn_starts(messages, first + 1) or [last_user]
        shortest = len(build(cuts[-1])[1])
        continuing = messages[-1].get("role") == "assistant" and cuts[-1] < len(messages) - 1
        if shortest > limit and continuing:
            kept = head + messages[cuts[-1] : -1]
            dropped = cuts[-1] - first
            return _cut_reply_start(render, kept, messages[-1], dropped, limit, context_limit, max_new_tokens)
        if shortest > limit:
            raise ContextOverflowError(
                f"the last message alone makes a prompt of {shortest} tokens, and the reply needs {room} "
                f"more: over the context of {context_limit} tokens. Shorten the message, or load the model "
                "with a longer context"
            )
        # drop down to half of what fits, so the next turns reuse the cache instead of dropping again
        target = limit // 2 if shortest <= limit // 2 else limit
        lo, hi = 0, len(cuts) - 1  # the fewest turns dropped that reach it: a binary search (each try renders)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(build(cuts[mid])[1]) <= target:
                hi = mid
            else:
                lo = mid + 1
        kept, ids = build(cuts[lo])
    capped = min(max_new_tokens, context_limit - len(ids))
    return FittedPrompt(ids, kept, len(messages) - len(kept), capped, capped < max_new_tokens)


def _cut_reply_start(render, kept: list[dict], reply: dict, dropped: int, limit: int, context_limit: int, asked: int):
    """The last turn (`kept`, then `reply`) with the start of its reply left out: the fewest
    characters that bring the prompt to half of what fits (or to what fits, for a long user
    message), a binary search over where the kept text begins, moved to the next line or word break."""
    text = reply["content"]

    def cut_at(start: int) -> tuple[list[dict], list[int]]:
        messages = kept + [{**reply, "content": text[start:]}]
        return messages, render(messages)

    bare = len(cut_at(len(text))[1])
    if bare > limit:
        raise ContextOverflowError(
            f"the last message alone makes a prompt of {bare} tokens, over what the context of {context_limit} "
            "tokens leaves with the reply's room: start a new conversation, or load the model with a longer context"
        )
    target = limit // 2 if bare <= limit // 2 else limit
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(cut_at(mid)[1]) <= target:
            hi = mid
        else:
            lo = mid + 1
    start = _break_after(text, lo)  # later than `lo`: a shorter prompt still
    messages, ids = cut_at(start)
    capped = min(asked, context_limit - len(ids))
    return FittedPrompt(ids, messages, dropped, capped, capped < asked, start)


def _break_after(text: str, start: int, reach: int = 80) -> int:
    """The first line or word break within `reach` characters after `start` (the kept text begins
    with a whole word), or `start` itself."""
    for mark in ("\n", " "):
        at = text.find(mark, start, start + reach)
        if at >= 0:
            return at + 1
    return start
