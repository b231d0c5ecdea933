"""A conversation as Markdown (to read and share) or JSON (everything, to process or re-import)."""

from __future__ import annotations

import json
import time

from flashdesk.app.reply import footer_text
from flashdesk.app.store import Conversation, Message

FORMAT = "flashdesk-conversation"
VERSION = 1


def to_markdown(conv: Conversation, messages: list[Message]) -> str:
    out = [f"# {conv.title}", "", f"_Exported from FlashDesk on {time.strftime('%Y-%m-%d %H:%M')}_", ""]
    if conv.system_prompt:
        out += ["**System prompt**", "", _quote(conv.system_prompt), ""]
    for m in messages:
        who = {"user": "You", "assistant": "Assistant", "system": "System"}.get(m.role, m.role)
        out += [f"## {who}", ""]
        if m.thought:
            seconds = f" ({m.thought_seconds:.1f} s)" if m.thought_seconds is not None else ""
            out += [f"<details><summary>Thought{seconds}</summary>", "", m.thought, "", "</details>", ""]
        out += [m.content, ""]
        if m.role == "assistant" and m.stats:
            out += [f"_{footer_text(m.stats)}_", ""]
        if m.state not in ("complete",):
            out += [f"_({m.state})_", ""]
    return "\n".join(out).rstrip() + "\n"


def _quote(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines())


def to_json(conv: Conversation, messages: list[Message]) -> str:
    data = {
        "format": FORMAT, "version": VERSION,
        "conversation": {"title": conv.title, "created": conv.created, "updated": conv.updated,
                         "system_prompt": conv.system_prompt, "sampling": conv.sampling},
        "messages": [{"role": m.role, "content": m.content, "thought": m.thought or None,
                      "thought_seconds": m.thought_seconds, "state": m.state, "model": m.model,
                      "created": m.created, "stats": m.stats} for m in messages],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
