"""`flashdesk chat --tools FILE`: tool files read into declarations (Python functions, shell commands),
their mistakes said by file and name, commands run without a shell, and the confirmed tool loop end
to end on the demo model (which calls a tool only when `--tool-choice` forces it)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import textwrap

import pytest

from flashdesk.engine.cli.main import main
from flashdesk.engine.cli.tool_files import MAX_OUTPUT, ToolFileError, command_argv, load_tools

PY = sys.executable


def write(folder, name: str, text: str):
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def chat(argv, lines: list[str]) -> tuple[int, str, str]:
    """Run `flashdesk chat` with `lines` on stdin, then its end."""
    out, err, old = io.StringIO(), io.StringIO(), sys.stdin
    sys.stdin = io.StringIO("".join(line + "\n" for line in lines))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["chat", *map(str, argv)])
    finally:
        sys.stdin = old
    return rc, out.getvalue(), err.getvalue()


# -- Python files ------------------------------------------------------------------------------------------


def test_a_python_files_public_functions_become_declarations(tmp_path):
    path = write(
        tmp_path,
        "tools.py",
        '''
        from __future__ import annotations

        from typing import Literal, Optional
        from os.path import join  # imported, not defined here: not a tool


        def add(a: int, b: int = 2, scale: float = 1.0, tags: list[str] | None = None, loud: bool = False) -> int:
            """Add two numbers.

            Args:
                a: the first number
                b: the second one,
                    two unless given
            """
            return a + b


        def pick(mode: Literal["fast", "slow"], level: Literal[1, 2, 3], note: Optional[str]) -> str:
            """Pick a mode."""
            return f"{mode}/{level}/{note}"


        def nothing():
            print("printed, not on the chat's stdout")


        def _helper(x):
            return x
        ''',
    )
    tools = load_tools([str(path)])
    assert [t.name for t in tools] == ["add", "pick", "nothing"]
    add, pick, nothing = tools
    assert add.description == "Add two numbers."
    assert add.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first number"},
            "b": {"type": "integer", "description": "the second one, two unless given"},
            "scale": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "loud": {"type": "boolean"},
        },
        "required": ["a"],
    }
    assert pick.parameters == {
        "type": "object",
        "properties": {
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "level": {"type": "integer", "enum": [1, 2, 3]},
            "note": {"type": "string"},
        },
        "required": ["mode", "level"],  # Optional without a default: None when left out
    }
    assert nothing.parameters == {"type": "object", "properties": {}} and nothing.description == ""
    assert add.declaration() == {
        "type": "function",
        "function": {"name": "add", "description": "Add two numbers.", "parameters": add.parameters},
    }
    assert add.run({"a": 3}) == "5"
    assert pick.run({"mode": "fast", "level": 2}) == "fast/2/None"
    assert nothing.run({}) == "printed, not on the chat's stdout"
    assert add.run({"b": 1}) == "error: missing a required argument: 'a'"
    assert add.run({"a": 1, "c": 2}) == "error: got an unexpected keyword argument 'c'"
    assert add.run({"a": "x"}).startswith("error: TypeError: ")  # the function's own failure, sent back


def test_all_picks_the_tools_and_a_long_result_is_cut(tmp_path):
    path = write(
        tmp_path,
        "t.py",
        """
        __all__ = ["big"]

        def big(n: int) -> str:
            return "x" * n

        def hidden(n: int) -> int:
            return n
        """,
    )
    (big,) = load_tools([str(path)])
    assert big.run({"n": 10}) == "x" * 10
    long = big.run({"n": MAX_OUTPUT + 50})
    assert long.startswith("x" * MAX_OUTPUT) and long.endswith("[... 50 more characters cut]")


@pytest.mark.parametrize(
    "files, expected",
    [
        ({}, "--tools {dir}/missing.py: no such file"),
        ({"t.py": "def f(x: int)\n    return x\n"}, "{dir}/t.py, line 1: syntax error: expected ':'"),
        ({"t.py": "import not_a_module_anywhere\n"}, "{dir}/t.py: loading it raised ModuleNotFoundError"),
        ({"t.py": "def f(x: set[int]):\n    pass\n"}, "{dir}/t.py: function f: parameter x: unsupported annotation"),
        ({"t.py": "def f(x):\n    pass\n"}, "{dir}/t.py: function f: parameter x needs a type annotation"),
        ({"t.py": "def f(*xs: int):\n    pass\n"}, "function f: parameter xs: a tool's parameters are named"),
        ({"t.py": "def f(x: 'Nope'):\n    pass\n"}, "{dir}/t.py: function f: cannot read its annotations"),
        ({"t.py": "X = 1\n"}, "{dir}/t.py: no tools in it"),
        ({"t.txt": "f"}, "--tools {dir}/t.txt: a tool file is .py"),
        (
            {"t.py": "def f(x: int):\n    pass\n", "u.json": '[{"name": "f", "command": ["true"]}]'},
            "two tools are named 'f': in {dir}/t.py and {dir}/u.json",
        ),
        (
            {"u.json": '[{"name": "f", "command": ["true"]}, {"name": "f", "command": ["true"]}]'},
            "two tools are named 'f': twice in {dir}/u.json",
        ),
        ({"u.json": "[{"}, "{dir}/u.json: not valid JSON"),
        ({"u.toml": "tools = 3"}, '{dir}/u.toml: expected a list of tools under "tools"'),
        ({"u.json": '[{"name": "f", "command": ["echo", "{who}"]}]'}, None),  # placeholders alone: string params
        (
            {"u.json": '[{"name": "f", "command": ["echo", "{who}"], "parameters": {"properties": {"x": {}}}}]'},
            "{dir}/u.json: tool f: bad placeholder {{who}}: not one of its parameters (x)",
        ),
        ({"u.json": '[{"name": "f", "command": ["echo", "{a.b}"]}]'}, "{dir}/u.json: tool f: command item"),
        ({"u.json": '[{"name": "f", "command": ["echo", "{x"]}]'}, "{dir}/u.json: tool f: command item '{{x'"),
        ({"u.json": '[{"name": "f", "command": ["{x}"]}]'}, "the program ('{{x}}') cannot be a placeholder"),
        ({"u.json": '[{"name": "f", "cmd": ["ls"]}]'}, "{dir}/u.json: tool f: unknown key(s) cmd"),
        ({"u.json": '[{"name": "f", "command": "ls -l"}]'}, "{dir}/u.json: tool f: command must be a list"),
        ({"u.json": '[{"name": "f g", "command": ["ls"]}]'}, "{dir}/u.json: tool 1: a tool's name is"),
        ({"u.json": '[{"name": "f", "command": ["no-such-program-x"]}]'}, "'no-such-program-x' is not on PATH"),
        ({"u.json": '[{"name": "f", "command": ["ls"], "timeout": 0}]'}, "{dir}/u.json: tool f: timeout is seconds"),
        (
            {"u.json": '[{"name": "f", "command": ["ls"], "parameters": {"properties": {"x": {}}}}]'},
            "{dir}/u.json: tool f: parameter x is in no {{placeholder}}",
        ),
    ],
)
def test_a_bad_tool_file_is_said_with_its_file_and_tool(tmp_path, files, expected):
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    paths = [str(tmp_path / name) for name in files] or [str(tmp_path / "missing.py")]
    if expected is None:
        (tool,) = load_tools(paths)
        assert tool.parameters["required"] == ["who"]
        return
    expected = expected.format(dir=tmp_path)
    with pytest.raises(ToolFileError) as exc:
        load_tools(paths)
    assert expected in str(exc.value)


# -- shell commands ----------------------------------------------------------------------------------------

ECHO_ARGV = [PY, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]


def test_shell_tools_substitute_each_argument_into_one_argv_item_without_a_shell(tmp_path):
    spec = {
        "tools": [
            {
                "name": "show",
                "description": "Show the arguments",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "pattern": {"type": "string"},
                        "files": {"type": "array", "items": {"type": "string"}},
                        "count": {"type": "integer"},
                        "exact": {"type": "boolean"},
                    },
                    "required": ["pattern"],
                },
                "command": [*ECHO_ARGV, "--pattern={pattern}", "{files}", "--max={count}", "{exact}"],
            }
        ]
    }
    (tool,) = load_tools([str(write(tmp_path, "t.json", json.dumps(spec)))])
    assert tool.description == "Show the arguments" and tool.parameters == spec["tools"][0]["parameters"]
    victim = tmp_path / "x"
    victim.mkdir()
    out = tool.run({"pattern": f"; rm -rf {victim}", "files": ["a b", "$(ls)"], "count": 3, "exact": True})
    assert json.loads(out) == [f"--pattern=; rm -rf {victim}", "a b", "$(ls)", "--max=3", "true"]
    assert victim.is_dir()  # no shell ever saw it
    # an optional parameter left out takes its argv items with it
    assert json.loads(tool.run({"pattern": "p", "files": []})) == ["--pattern=p"]
    assert command_argv(["echo", "{{literal}}", "{a}"], {"a": "$HOME"}) == ["echo", "{literal}", "$HOME"]
    assert tool.run({"pattern": "p", "bogus": 1}) == "error: unknown argument(s) bogus"


def test_shell_failures_come_back_as_error_text(tmp_path):
    write(
        tmp_path,
        "t.toml",
        f"""
        [[tools]]
        name = "fail"
        command = ["{PY}", "-c", "import sys; print('partial'); sys.exit('{{why}}')"]

        [[tools]]
        name = "slow"
        command = ["{PY}", "-c", "import time; time.sleep(30)"]
        timeout = 0.5

        [[tools]]
        name = "loud"
        command = ["{PY}", "-c", "print('y' * 20000)"]
        """,
    )
    fail, slow, loud = load_tools([str(tmp_path / "t.toml")])
    assert fail.parameters == {"type": "object", "properties": {"why": {"type": "string"}}, "required": ["why"]}
    assert fail.run({"why": "broken"}) == "error: exit status 1\npartial\n[stderr]\nbroken\n"
    assert slow.run({}) == "error: timed out after 0.5 s\n"
    assert loud.run({}).endswith(f"[... {20001 - MAX_OUTPUT} more characters cut]")


# -- the tool loop, end to end on the demo model -----------------------------------------------------------


@pytest.fixture(scope="module")
def demo():
    """The demo pair made once (the data folder is the tests' throwaway one)."""
    from flashdesk.engine.hub.demo import demo_pair

    return demo_pair()


def note_tools(tmp_path):
    """A tool that writes to a file: the proof that a call ran."""
    notes = tmp_path / "notes.txt"
    path = write(
        tmp_path,
        "notes.py",
        f'''
        from typing import Literal

        def write_note(kind: Literal["todo", "done"]) -> str:
            """Write a note to the notes file."""
            with open({str(notes)!r}, "a") as f:
                f.write(kind + "\\n")
            return f"wrote a {{kind}} note"

        def add(a: int, b: int) -> int:
            """Add two numbers."""
            return a + b
        ''',
    )
    return path, notes


def test_calls_are_read_by_token_and_a_spelled_out_call_is_text(demo, tmp_path):
    from flashdesk.engine.cli.tool_loop import ToolBox
    from flashdesk.engine.decode.chat_format import load_tokenizer
    from flashdesk.engine.decode.tool_calls import MARK

    box = ToolBox(load_tools([str(note_tools(tmp_path)[0])]), load_tokenizer(demo[0]))
    spelled = "See <|tool_call>call:add{a:1,b:2}<tool_call|> for the format."
    assert box.read(spelled) == (spelled, [], False)
    text, (call,), cut = box.read(f"Sure.{MARK}<|tool_call>call:add{{a:1,b:2}}{MARK}<tool_call|>")
    assert text == "Sure." and not cut and call.tool is not None
    assert (call.name, call.arguments, call.run(), call.status) == ("add", {"a": 1, "b": 2}, "3", "ran")
    (unknown,) = box.read(f"{MARK}<|tool_call>call:nope{{}}{MARK}<tool_call|>")[1]
    assert unknown.run() == "error: there is no tool named 'nope'" and unknown.status == "failed"
    assert box.read(f"{MARK}<|tool_call>call:add{{a:1")[1:] == ([], True)  # cut off by max new tokens


def test_a_forced_call_is_confirmed_run_and_its_result_goes_back(demo, tmp_path):
    tools, notes = note_tools(tmp_path)
    saved = tmp_path / "chat.json"
    args = ["--demo", "--device", "cpu", "--tools", tools, "--tool-choice", "write_note", "--max-new-tokens", 24]
    rc, out, err = chat(args, ["Please write a note", "y", f"/save {saved}"])
    assert rc == 0, err
    assert "[tools: write_note, add; --tool-choice write_note; each call is shown and asks y/N first]" in err
    assert '[tool call] write_note({"kind": ' in err and "run it? [y/N] y" in err
    assert notes.read_text() in ("todo\n", "done\n")  # the call ran, once
    assert f"[tool result] wrote a {notes.read_text().strip()} note" in err
    assert "2 rounds, 1 tool call(s)]" in err  # the result went back and the model went on
    assert "<|tool_call>" not in out and "call:" not in out  # the call's markup is not the answer
    messages = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    call = messages[1]["tool_calls"][0]
    assert call["function"]["name"] == "write_note" and messages[2]["tool_call_id"] == call["id"]
    assert messages[2]["content"] == f"wrote a {notes.read_text().strip()} note"


def test_a_declined_call_does_not_run_and_the_model_is_told(demo, tmp_path):
    tools, notes = note_tools(tmp_path)
    saved = tmp_path / "chat.json"
    args = ["--demo", "--device", "cpu", "--tools", tools, "--tool-choice", "write_note", "--max-new-tokens", 24]
    rc, out, err = chat(args, ["Please write a note", "n", f"/save {saved}"])
    assert rc == 0, err
    assert not notes.exists() and "[declined: the model is told so]" in err
    tool_message = json.loads(saved.read_text())["messages"][2]
    assert tool_message["role"] == "tool" and tool_message["content"] == "the user declined to run this call"


def test_jsonl_with_yes_reports_each_call_and_the_round_cap_is_said(demo, tmp_path, monkeypatch):
    from flashdesk.engine.cli import tool_loop

    tools, notes = note_tools(tmp_path)
    monkeypatch.setattr(tool_loop, "MAX_ROUNDS", 3)
    forced = ["--demo", "--device", "cpu", "--tools", tools, "--tool-choice", "write_note", "--max-new-tokens", 24]
    rc, out, err = chat([*forced, "--jsonl", "--yes"], [json.dumps({"user": "Note it"})])
    assert rc == 0, err
    assert "--yes: each call runs without asking" in err
    (reply,) = [json.loads(line) for line in out.splitlines()]
    assert reply["rounds"] == 2 and [c["status"] for c in reply["tool_calls"]] == ["ran"]
    assert reply["tool_calls"][0]["result"] == f"wrote a {reply['tool_calls'][0]['arguments']['kind']} note"

    # a model that calls every round: after MAX_ROUNDS rounds it must answer without tools
    monkeypatch.setattr(tool_loop.ToolBox, "round_choice", lambda self, i: "write_note" if i < 3 else "none")
    rc, out, err = chat([*forced, "--jsonl", "--yes"], [json.dumps({"user": "Note it"})])
    (reply,) = [json.loads(line) for line in out.splitlines()]
    assert reply["rounds"] == 4 and len(reply["tool_calls"]) == 3 and "<|tool_call>" not in reply["text"]
    assert reply["note"] == "3 rounds of tool calls, the limit per message: then it answered without tools"
    assert len(notes.read_text().splitlines()) == 1 + 3


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tool-choice", "required"], "--tool-choice and --yes go with --tools FILE"),
        (["--yes"], "--tool-choice and --yes go with --tools FILE"),
        (["--tools", "{tools}", "--jsonl"], "--jsonl with --tools needs --yes"),
        (["--tools", "{tools}", "--ignore-eos"], "--ignore-eos cannot go with --tools"),
        (["--tools", "{tools}", "--tool-choice", "nope"], "--tool-choice is auto, none, required or a tool's name"),
        (["--tools", "{dir}/none.py"], "--tools {dir}/none.py: no such file"),
    ],
)
def test_tool_flags_that_cannot_work_exit_2(demo, tmp_path, extra, message):
    tools, _ = note_tools(tmp_path)
    extra = [str(a).format(tools=tools, dir=tmp_path) for a in extra]
    rc, out, err = chat(["--demo", "--device", "cpu", *extra], [])
    assert rc == 2 and f"flashdesk chat: error: {message.format(dir=tmp_path)}" in err
