"""A conversation as Markdown (to read and share) or JSON (the branch shown with its statistics and
thoughts, to process), and the file name it is suggested under.

Either writes the branch shown (store.Store.messages), as the window shows it. The other versions of
a regenerated reply are answers to the same message, so they are kept, folded under the reply; the
other branches (the earlier versions of an edited message, what followed another version of a
reply) are not written: they are another conversation from that point on."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from flashdesk.app.chat.reply import footer_text
from flashdesk.app.history.store import Conversation, Message
from flashdesk.app.history.titles import shorten

FORMAT = "flashdesk-conversation"
VERSION = 1
EXTENSIONS = {"md": (".md", ".markdown"), "json": (".json",)}  # the first is the one added
NAME_CHARS = 60
# characters Windows, macOS or Linux refuse in a file name, or that shells and other tools trip on
_AWKWARD = re.compile(r'[/\\:*?"<>|\x00-\x1f\x7f-\x9f]')
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}


def file_name(title: str, kind: str) -> str:
    """The suggested file name for exporting conversation `title` as `kind` ("md" or "json"): the
    title without characters a file system refuses, short, and never a Windows device name."""
    stem = " ".join(_AWKWARD.sub(" ", title).split())
    # no dot in front (it hides the file) nor at the end (Windows drops it)
    stem = shorten(stem, NAME_CHARS).rstrip("…").strip(" .")
    if stem.split(".")[0].upper() in _RESERVED:
        stem += "_"
    return (stem or "conversation") + EXTENSIONS[kind][0]


def with_extension(path: Path, kind: str) -> Path:
    """`path` with the extension of `kind` added when the name has none of its extensions (a name
    typed without one; "notes.txt" becomes "notes.txt.md")."""
    if path.suffix.lower() in EXTENSIONS[kind]:
        return path
    return path.with_name(path.name + EXTENSIONS[kind][0])


def to_markdown(conv: Conversation, messages: list[Message], versions: dict[int, list[Message]] | None = None) -> str:
    """The conversation as it reads; a regenerated reply is the version chosen, the others folded
    under it (`versions`: message id -> every version of that message, oldest first; a reply's only are used)."""
    out = [f"# {conv.title}", "", f"_Exported from FlashDesk on {time.strftime('%Y-%m-%d %H:%M')}_", ""]
    if conv.system_prompt:
        out += ["**System prompt**", "", _quote(conv.system_prompt), ""]
    for m in messages:
        who = {"user": "You", "assistant": "Assistant", "system": "System"}.get(m.role, m.role)
        out += [f"## {who}", ""]
        if m.thought:
            seconds = f" ({m.thought_seconds:.1f} s)" if m.thought_seconds is not None else ""
            out += [f"<details><summary>Thought{seconds}</summary>", "", closed_fences(m.thought), "", "</details>", ""]
        out += [closed_fences(m.content), ""]
        if m.role == "assistant" and m.stats:
            out += [f"_{footer_text(m.stats)}_", ""]
        if m.state not in ("complete",):
            out += [f"_({m.state})_", ""]
        others = [v for v in _reply_versions(m, versions) if v.id != m.id]
        if others:
            out += [f"<details><summary>Version {m.version} of {m.versions}: the other versions</summary>", ""]
            for v in others:
                out += [f"**Version {v.version}**", "", closed_fences(v.content), ""]
            out += ["</details>", ""]
    return "\n".join(out).rstrip() + "\n"


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def closed_fences(text: str) -> str:
    """`text` with a code fence it leaves open closed (a reply cut off inside a code block), so the
    rest of the document does not render as code (CommonMark: a fence closes with at least as
    many of the same character, alone on its line)."""
    open_fence = None
    for line in text.splitlines():
        found = _FENCE.match(line)
        if not found:
            continue
        fence = found.group(1)
        if open_fence is None:
            if fence[0] == "`" and "`" in line.strip()[len(fence) :]:
                continue  # ```x``` on its own is inline code, not a fence (CommonMark)
            open_fence = fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not line.strip()[len(fence) :].strip():
            open_fence = None
    if open_fence is None:
        return text
    return text.rstrip("\n") + "\n" + open_fence[0] * len(open_fence)


def _reply_versions(m: Message, versions: dict[int, list[Message]] | None) -> list[Message]:
    """Every version of `m` when it is a reply (the versions of a user message start other branches)."""
    return (versions or {}).get(m.id, []) if m.role == "assistant" else []


def _quote(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines())


def _message_json(m: Message) -> dict:
    return {
        "role": m.role,
        "content": m.content,
        "thought": m.thought or None,
        "thought_seconds": m.thought_seconds,
        "state": m.state,
        "model": m.model,
        "created": m.created,
        "stats": m.stats,
    }


def to_json(conv: Conversation, messages: list[Message], versions: dict[int, list[Message]] | None = None) -> str:
    """Everything: a regenerated reply is the version chosen, with `version` (from 1) and `versions`,
    every version of it, oldest first."""
    rows = []
    for m in messages:
        row = _message_json(m)
        if len(_reply_versions(m, versions)) > 1:
            row["version"] = m.version
            row["versions"] = [_message_json(v) for v in _reply_versions(m, versions)]
        rows.append(row)
    data = {
        "format": FORMAT,
        "version": VERSION,
        "conversation": {
            "title": conv.title,
            "created": conv.created,
            "updated": conv.updated,
            "system_prompt": conv.system_prompt,
            "sampling": conv.sampling,
        },
        "messages": rows,
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
