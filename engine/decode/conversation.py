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
) -> FittedPrompt:
    """Build the prompt; when it leaves the reply less than `reply_room`, drop the oldest turns
    (keeping the system prompt and the last user message) until it takes at most half of the rest
    (dropping once per many turns, as llama.cpp's context shift does), or, under STOP, refuse.

    Raises ContextOverflowError with what to do when even the last message alone does not fit.
    """
    check_policy(policy)
    check_messages(messages)
    if max_new_tokens < 1:
        raise ValueError(f"max new tokens must be at least 1, got {max_new_tokens}")
    room = reply_room(context_limit, max_new_tokens)
    limit = context_limit - room

    def build(start: int) -> tuple[list[dict], list[int]]:
        kept = head + messages[start:]
        return kept, build_prompt_ids(tokenizer, kept, enable_thinking=thinking)

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
        cuts = _turn_starts(messages, first + 1) or [len(messages) - 1]
        shortest = len(build(cuts[-1])[1])
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
