"""A conversation's automatic title: its first message as one line of plain text.

Why strip Markdown: the title is shown as plain text (the sidebar, the window title, export file
names), where "## **Fix** `main()`" would show its syntax instead of "Fix main()".
"""

from __future__ import annotations

import re

TITLE_CHARS = 48

_FENCE = re.compile(r"^\s*(```|~~~).*$", re.MULTILINE)  # the fence line, with its language tag
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$", re.MULTILINE)
_HEADING = re.compile(r"^\s{0,3}#{1,6}(\s+|$)|\s+#+\s*$", re.MULTILINE)
_QUOTE = re.compile(r"^\s*(>\s?)+", re.MULTILINE)
_LIST = re.compile(r"^\s*([-*+]|\d{1,9}[.)])\s+(\[[ xX]\]\s+)?", re.MULTILINE)
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]*)\](\([^)]*\)|\[[^\]]*\])")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
_CODE = re.compile(r"(`+)(.+?)\1")
_STRONG = re.compile(r"(\*\*|__|~~)(?=\S)(.+?)(?<=\S)\1")
_EMPHASIS = re.compile(r"(?<![\w*])([*_])(?=\S)(.+?)(?<=\S)\1(?![\w*])")


def plain_text(markdown: str) -> str:
    """`markdown` without its syntax, on one line (the words of code and links are kept)."""
    text = _FENCE.sub("", markdown)
    for pattern in (_RULE, _HEADING, _QUOTE, _LIST):
        text = pattern.sub("", text)
    text = _IMAGE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _AUTOLINK.sub(r"\1", text)
    text = _CODE.sub(lambda m: m.group(2).strip(), text)
    text = _STRONG.sub(r"\2", text)
    text = _EMPHASIS.sub(r"\2", text)
    return " ".join(text.split())


def shorten(text: str, limit: int) -> str:
    """`text` cut at a word boundary to at most `limit` characters, the cut marked with "…"."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if not text[limit - 1].isspace() and space > limit // 2:  # inside a word: back to the space before it,
        cut = cut[:space]  # unless the word is very long
    return cut.rstrip(" ,;:.-–—") + "…"


def title_from(message: str, limit: int = TITLE_CHARS) -> str:
    """The title for a conversation that starts with `message` ("" when it has no words)."""
    return shorten(plain_text(message), limit)
