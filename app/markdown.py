"""Text -> what a message body shows: Markdown with a copy link above each code block, or the raw
text coloured by origin (accepted draft token vs target token). Pure functions, no widgets.

Why links for copy buttons: Qt's Markdown renderer (QTextDocument.setMarkdown) has no widgets
inside the text, but it does render links, and a QTextBrowser reports clicks on them; a
`copy:N` link above code block N is a copy button that flows with the text.
"""

from __future__ import annotations

import html
import re

COPY_SCHEME = "copy"
_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


def code_blocks(text: str) -> list[tuple[int, int, str]]:
    """Fenced code blocks as (first line, line after the closing fence, code). An unclosed fence
    (a reply still streaming) runs to the end."""
    lines = text.split("\n")
    blocks = []
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
            if close and close.group(2)[0] == fence[0] and len(close.group(2)) >= len(fence) and not close.group(3).strip():
                break
            j += 1
        blocks.append((i, min(j + 1, len(lines)), "\n".join(lines[i + 1:j])))
        i = j + 1
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


def origin_html(text: str, origins: list[list], draft_bg: str, draft_fg: str) -> str:
    """The raw text as HTML, accepted draft characters highlighted. `origins` are [[chars, "d"|"t"]]
    runs over `text`; characters past them are shown as target text."""
    parts = []
    pos = 0
    for n, origin in origins:
        chunk = html.escape(text[pos:pos + n])
        pos += n
        if not chunk:
            continue
        if origin == "d":
            parts.append(f'<span style="background-color:{draft_bg}; color:{draft_fg};">{chunk}</span>')
        else:
            parts.append(chunk)
    parts.append(html.escape(text[pos:]))
    body = "".join(parts).replace("\n", "<br>")
    return f'<div style="white-space: pre-wrap;">{body}</div>'
