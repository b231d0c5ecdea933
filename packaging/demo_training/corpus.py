"""Stage 1, the corpus: our docs and the Python standard library as plain text, and chat examples made
from them (a docstring's summary -> the function; a module -> its docstring; a heading -> its section)."""

from __future__ import annotations

import ast
import hashlib
import random
import re
import subprocess
import textwrap
from pathlib import Path

from .recipe import ROOT, STDLIB


VERBS = set(
    """return get set create make compute convert check add remove delete read write parse find build load
save format print run call open close update initialize generate encode decode split join copy move sort count
test validate register send receive start stop wait reset clear apply append insert extend replace strip escape
quote unquote normalize resolve search match compile execute fetch emit raise yield handle process construct
determine calculate compare show display draw render list iterate collect merge filter map wrap unwrap
translate tokenize decorate install import export""".split()
)

HELD_OUT = 1600  # requests kept out of the target's training: the drafter's data are its replies to them


SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "Be brief.",
    "You are terse.",
    "Answer concisely.",
    "You are a Python expert.",
)

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "encodings", "__pycache__", "lib2to3"}


def stdlib_files() -> list[Path]:
    files = []
    for path in sorted(STDLIB.rglob("*.py")):
        rel = path.relative_to(STDLIB)
        if set(rel.parts[:-1]) & SKIP_DIRS or rel.name.startswith("test_") or path.stat().st_size > 800_000:
            continue
        files.append(path)
    return files


def doc_texts(revision: str, extra: list[Path]) -> list[tuple[str, str]]:
    """(name, text) of our Markdown: README.md and docs/**.md as committed at `revision` (read with
    `git show`, so edits in the working tree do not change the weights), or as they are now with
    revision "worktree"; then the Markdown under each --docs folder."""
    if revision == "worktree":
        found = [
            (str(f.relative_to(ROOT)), read(f))
            for f in [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
            if f.is_file()
        ]
    else:

        def git(*args: str) -> str:
            try:
                return subprocess.run(
                    ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True, encoding="utf-8"
                ).stdout
            except (OSError, subprocess.CalledProcessError) as exc:
                raise SystemExit(
                    f"train_demo: cannot read our docs at git revision {revision} ({exc}); "
                    "give --docs-revision worktree to use the files as they are"
                ) from None

        names = [
            n
            for n in git("ls-tree", "-r", "--name-only", revision, "--", "README.md", "docs").splitlines()
            if n.endswith(".md")
        ]
        found = [(n, clean(git("show", f"{revision}:{n}"))) for n in sorted(names)]
    for folder in extra:
        found += [(str(f), read(f)) for f in sorted(Path(folder).rglob("*.md"))]
    return found


def clean(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\t", "    ")


def read(path: Path) -> str:
    return clean(path.read_text(encoding="utf-8", errors="replace"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(STDLIB).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def first_sentence(doc: str) -> str:
    line = doc.strip().split("\n\n")[0].replace("\n", " ")
    line = re.sub(r"\s+", " ", line).strip()
    match = re.match(r"(.+?[.!?])(\s|$)", line)
    return (match.group(1) if match else line).strip()


def _request_for(name: str, signature: str, summary: str, pick: int, kind: str) -> str:
    lowered = summary[0].lower() + summary[1:] if summary[:2] != summary[:2].upper() else summary
    bare = lowered.rstrip(".")
    imperative = bare.split(" ")[0] in VERBS
    if kind == "class":
        options = [
            f"Write a Python class {name}: {summary}",
            f"Implement a class {name} in Python. {summary}",
            f"Show me a Python class that works like this: {summary}",
        ]
    elif imperative:
        options = [
            f"Write a Python function to {bare}.",
            f"Write a Python function {name}{signature} to {bare}.",
            f"Implement {name}{signature} in Python: {summary}",
            f"How do I {bare} in Python?",
        ]
    else:
        options = [
            f"Write a Python function {name}{signature}. {summary}",
            f"Implement {name} in Python. {summary}",
            f"Write a Python function: {summary}",
        ]
    return options[pick % len(options)]


def _reply_with_code(name: str, code: str, pick: int) -> str:
    intros = ["", f"Here is `{name}`:\n\n", "Here is one way to write it:\n\n", f"Sure. `{name}` in Python:\n\n"]
    return f"{intros[pick % len(intros)]}```python\n{code}\n```"


def stdlib_examples(path: Path, text: str) -> list[tuple[str, str]]:
    """(request, reply) pairs from one module: functions and small classes with docstrings, and docstrings."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.split("\n")
    mod = module_name(path)
    pairs = []
    doc = ast.get_docstring(tree)
    if doc and len(doc) > 80:
        answer = textwrap.dedent(doc).strip()[:1200]
        pairs.append(
            (f"What does the Python module {mod} do?" if len(pairs) % 2 == 0 else f"Describe the {mod} module.", answer)
        )
    nodes = [(n, None) for n in tree.body]
    nodes += [(m, n.name) for n in tree.body if isinstance(n, ast.ClassDef) for m in n.body]
    for node, owner in nodes:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or node.name.startswith("__") or node.end_lineno - node.lineno > 60:
            continue
        code = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        summary = first_sentence(doc)
        if len(summary) < 12 or len(summary) > 200:
            continue
        code = textwrap.dedent(code)
        pick = int(hashlib.sha256(f"{mod}.{node.name}".encode()).hexdigest(), 16)
        qualified = f"{mod}.{owner + '.' if owner else ''}{node.name}"
        if 60 <= len(code) <= 1600:
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            args = "" if kind == "class" else f"({ast.unparse(node.args)})"
            pairs.append((_request_for(node.name, args, summary, pick, kind), _reply_with_code(node.name, code, pick)))
        if len(doc) > 60 and pick % 3 == 0:
            pairs.append((f"What does {qualified} do?", textwrap.dedent(doc).strip()[:800]))
    return pairs


def doc_examples(text: str) -> list[tuple[str, str]]:
    """(request, reply) pairs from a Markdown file: each section under its heading."""
    pairs = []
    for section in re.split(r"\n(?=#{1,4} )", "\n" + text):
        section = section.strip()
        if not section.startswith("#"):
            continue
        heading, _, body = section.partition("\n")
        heading = heading.lstrip("#").strip().strip("`")
        body = body.strip()
        if len(body) < 80 or not heading:
            continue
        pick = int(hashlib.sha256(heading.encode()).hexdigest(), 16)
        request = [
            f"Explain {heading}.",
            f"Tell me about {heading}.",
            f"What is {heading}?",
            f'Summarize the section "{heading}".',
        ][pick % 4]
        pairs.append((request, body[:1500]))
    return pairs


def chat_text(pairs: list[tuple[str, str]], system: str | None) -> str:
    """One conversation in the Gemma 4 format, as the chat template renders it, the last reply after
    the empty thought channel of a generation prompt and ending in <turn|>."""
    out = "<bos>"
    if system:
        out += f"<|turn>system\n{system}<turn|>\n"
    for i, (request, reply) in enumerate(pairs):
        out += f"<|turn>user\n{request.strip()}<turn|>\n<|turn>model\n"
        if i == len(pairs) - 1:
            out += "<|channel>thought\n<channel|>"
        out += f"{reply.strip()}<turn|>\n"
    return out


def build_corpus(docs_revision: str, extra_docs: list[Path]) -> dict:
    """Plain documents, chat conversations, and held-out requests for the drafter's data."""
    rng = random.Random(1)
    plain, pairs, manifest = [], [], []
    docs = [("docs", name, text, None) for name, text in doc_texts(docs_revision, extra_docs)]
    stdlib = [("stdlib", str(path.relative_to(STDLIB)), read(path), path) for path in stdlib_files()]
    for kind, name, text, path in docs + stdlib:
        manifest.append((kind, name, hashlib.sha256(text.encode()).hexdigest()[:16], len(text)))
        plain.append(text)
        found = doc_examples(text) if kind == "docs" else stdlib_examples(path, text)
        # our own docs are few: they count three times, as plain text and as conversations
        pairs += found * (3 if kind == "docs" else 1)
        if kind == "docs":
            plain += [text, text]
    rng.shuffle(pairs)
    held_out, pairs = pairs[:HELD_OUT], pairs[HELD_OUT:]
    chats, i = [], 0
    while i < len(pairs):
        turns = 2 if rng.random() < 0.1 else 1
        system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.2 else None
        chats.append(chat_text(pairs[i : i + turns], system))
        i += turns
    return {"plain": plain, "chats": chats, "held_out": held_out, "manifest": manifest}
