"""Text -> what a message body shows: Markdown with a copy link above each code block, and which
characters of the rendered text came from accepted draft tokens. Pure functions, no widgets.

Why links for copy buttons: Qt's Markdown renderer (QTextDocument.setMarkdown) has no widgets
inside the text, but it does render links, and a QTextBrowser reports clicks on them; a
`copy:N` link above code block N is a copy button that flows with the text.

Why align instead of marking up: colour by origin must keep the Markdown formatting, and origins
are character runs over the source, whose syntax (`**`, `#`, fences, link targets) the renderer
drops. Each rendered character is matched to the next equal source character, so the highlight
lands on the rendered text whatever the renderer did; a character it added is just left plain.
"""

from __future__ import annotations

import re

COPY_SCHEME = "copy"
DRAFT = "d"
_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")
_LINE_SYNTAX = re.compile(r"^ {0,3}(?:>\s?)*(?:#{1,6}(?=\s|$)|[-*+](?=\s)(?:\s+\[[ xX]\])?|\d{1,9}[.)](?=\s))?")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_HIDDEN = "\0"  # a masked source character: never equal to a rendered one
_SKIPPABLE = "\0*_~`"  # what may stand between a rendered space and the source's


def _fences(lines: list[str]) -> list[tuple[int, int | None]]:
    """Fenced code blocks as (opening fence line, closing fence line or None while unclosed)."""
    fences = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or (m.group(2)[0] == "`" and "`" in m.group(3)):
            i += 1
            continue
        fence = m.group(2)
        j = i + 1
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if (
                close
                and close.group(2)[0] == fence[0]
                and len(close.group(2)) >= len(fence)
                and not close.group(3).strip()
            ):
                break
            j += 1
        fences.append((i, j if j < len(lines) else None))
        i = j + 1
    return fences


def code_blocks(text: str) -> list[tuple[int, int, str]]:
    """Fenced code blocks as (first line, line after the closing fence, code). An unclosed fence
    (a reply still streaming) runs to the end."""
    lines = text.split("\n")
    blocks = []
    for start, close in _fences(lines):
        end = len(lines) if close is None else close
        blocks.append((start, min(end + 1, len(lines)), "\n".join(lines[start + 1 : end])))
    return blocks


def with_copy_links(text: str) -> tuple[str, list[str]]:
    """The Markdown to render (a `Copy code` link line before each fenced block) and the blocks."""
    blocks = code_blocks(text)
    if not blocks:
        return text, []
    lines = text.split("\n")
    out: list[str] = []
    last = 0
    for n, (start, end, _code) in enumerate(blocks):
        out += lines[last:start]
        indent = _FENCE.match(lines[start]).group(1)
        out += ["", f"{indent}[Copy code]({COPY_SCHEME}:{n})", ""]
        out += lines[start:end]
        last = end
    out += lines[last:]
    return "\n".join(out), [code for _, _, code in blocks]


def _hide(text: str) -> str:
    return _HIDDEN * len(text)


def _mask_line(line: str) -> str:
    """A prose line with its block markers (heading, list, quote) and link targets hidden."""
    marker = _LINE_SYNTAX.match(line).end()
    line = _hide(line[:marker]) + line[marker:]
    return _LINK_TARGET.sub(lambda m: "]" + _hide(m.group(0)[1:]), line)


def masked_source(text: str) -> str:
    """`text`, as long, with the Markdown syntax that never shows as text hidden: fence lines,
    block markers and link targets (so a code block's first letter cannot match its fence's
    language name, nor a word after a link the link's URL). Code stays as it is."""
    lines = text.split("\n")
    code: dict[int, bool] = {}  # line -> is a fence line
    for start, close in _fences(lines):
        end = len(lines) if close is None else close
        code.update({i: False for i in range(start + 1, end)})
        code.update({i: True for i in (start, close) if i is not None})
    return "\n".join(
        _hide(line) if code.get(i) else line if i in code else _mask_line(line) for i, line in enumerate(lines)
    )


def _draft_flags(length: int, origins: list[list]) -> bytearray:
    """One flag per source character: 1 where it came from an accepted draft token."""
    flags = bytearray(length)
    pos = 0
    for n, origin in origins:
        end = min(pos + n, length)
        if origin == DRAFT and end > pos:
            flags[pos:end] = b"\1" * (end - pos)
        pos += n
    return flags


def _match_space(source: str, pos: int) -> int:
    """Where the rendered whitespace at source position `pos` is, or -1 (the renderer added it)."""
    while pos < len(source) and source[pos] in _SKIPPABLE:
        pos += 1
    return pos if pos < len(source) and source[pos].isspace() else -1


def draft_ranges(text: str, origins: list[list], fragments: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """The [start, end) document ranges that show accepted draft characters. `fragments` are the
    rendered text as (document position, text) in document order, without text the renderer
    made up (copy links); `origins` are [[chars, "d"|"t"]] runs over `text`."""
    flags = _draft_flags(len(text), origins)
    source = masked_source(text)
    ranges: list[list[int]] = []
    pos = 0
    for at, piece in fragments:
        for k, ch in enumerate(piece):
            i = _match_space(source, pos) if ch.isspace() else source.find(ch, pos)
            if i < 0:
                continue
            pos = i + 1
            if flags[i]:
                if ranges and ranges[-1][1] == at + k:
                    ranges[-1][1] += 1
                else:
                    ranges.append([at + k, at + k + 1])
    return [(a, b) for a, b in ranges]
