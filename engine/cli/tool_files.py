"""`flashdesk chat --tools FILE`: the tools a user hands the model, read from a file, and how each one runs.

A `.py` file: each public top-level function is a tool. Its name, docstring and type-annotated
parameters become the declaration the model sees (str, int, float, bool, list[...], dict, Literal[...],
Optional[...] / `X | None`; a parameter is required unless it has a default or is Optional), and a
call runs the function in this process with the model's arguments.

A `.json` or `.toml` file: shell-command tools, `{"tools": [{"name", "description", "parameters",
"command", "timeout"}]}` (TOML: `[[tools]]` tables). `command` is an argv list whose items may hold
`{param}` placeholders; it runs without a shell, so an argument is always one argv item whatever its
text (`; rm -rf x` stays a string). An item whose placeholder has no value (an optional parameter
left out) is left out; an item that is exactly `{param}` with a list value becomes one item per element.

Every problem in a file is a ToolFileError naming the file and the tool, raised before the model loads.
Running never raises: an exception, a non-zero exit or a timeout is the result's error text, which
goes back to the model like any result.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import json
import os
import re
import shutil
import signal
import string
import subprocess
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Union

from flashdesk.engine.errors import FlashDeskError

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name, as `serve` checks it
MAX_OUTPUT = 8000  # characters of a result sent back to the model: a long output would fill the context
DEFAULT_TIMEOUT = 30.0  # seconds a shell command may run
MAX_TIMEOUT = 3600.0
SHELL_KEYS = {"name", "description", "parameters", "command", "timeout"}
SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
SUPPORTED = "str, int, float, bool, list[...], dict, Literal[...] or Optional[...]"


class ToolFileError(FlashDeskError):
    """A tool file that cannot be used: said with the file, the tool and what to change."""


@dataclass
class Tool:
    """One tool: its declaration (what the model sees) and `run(arguments) -> text` (never raises)."""

    name: str
    description: str
    parameters: dict
    run: Callable[[dict], str]
    source: str  # the file it came from, for messages

    def declaration(self) -> dict:
        """OpenAI's tool object, which the chat template declares in Gemma 4's format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def load_tools(paths: list[str]) -> list[Tool]:
    """The tools of every file, in order; a name twice (in one file or two) is an error."""
    tools: list[Tool] = []
    seen: dict[str, str] = {}
    for given in paths:
        path = Path(given).expanduser()
        if not path.is_file():
            raise ToolFileError(f"--tools {given}: no such file")
        kind = path.suffix.lower()
        if kind == ".py":
            found = _python_tools(path)
        elif kind in (".json", ".toml"):
            found = _shell_tools(path)
        else:
            raise ToolFileError(f"--tools {path}: a tool file is .py (Python functions) or .json / .toml (commands)")
        if not found:
            raise ToolFileError(f"{path}: no tools in it (a .py file's public top-level functions are its tools)")
        for tool in found:
            if tool.name in seen:
                where = "twice in " + str(path) if seen[tool.name] == str(path) else f"in {seen[tool.name]} and {path}"
                raise ToolFileError(f"two tools are named {tool.name!r}: {where}")
            seen[tool.name] = str(path)
            tools.append(tool)
    return tools


def clip(text: str, limit: int = MAX_OUTPUT) -> str:
    """At most `limit` characters, saying how many were cut, so one output cannot fill the context."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


# -- Python functions --------------------------------------------------------------------------------------


def _python_tools(path: Path) -> list[Tool]:
    module = _import(path)
    names = getattr(module, "__all__", None)
    tools = []
    for name, value in vars(module).items():
        public = name in names if isinstance(names, (list, tuple)) else not name.startswith("_")
        if public and inspect.isfunction(value) and value.__module__ == module.__name__:
            tools.append(_function_tool(value, path))
    return tools


def _import(path: Path) -> types.ModuleType:
    """The file run as a module of its own (its imports and top-level code run once, here)."""
    name = f"flashdesk_tools_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ToolFileError(f"{path}: cannot be loaded as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and string annotations look their module up there
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise ToolFileError(f"{path}, line {exc.lineno}: syntax error: {exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's file raises is said, naming it
        del sys.modules[name]
        raise ToolFileError(f"{path}: loading it raised {type(exc).__name__}: {exc}") from None
    return module


def _function_tool(fn: Callable, path: Path) -> Tool:
    where = f"{path}: function {fn.__name__}"
    if not NAME.match(fn.__name__):
        raise ToolFileError(f"{where}: a tool's name is 1 to 64 letters, digits, _ or -")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # noqa: BLE001 - an annotation naming something undefined, or worse
        raise ToolFileError(f"{where}: cannot read its annotations: {exc}") from None
    description, notes = _docstring(inspect.getdoc(fn) or "")
    signature = inspect.signature(fn)
    properties: dict[str, dict] = {}
    required, optional = [], []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolFileError(f"{where}: parameter {param.name}: a tool's parameters are named (no *args, **kw, /)")
        if param.name not in hints:
            raise ToolFileError(f"{where}: parameter {param.name} needs a type annotation ({SUPPORTED})")
        schema, nullable = _schema(hints[param.name], f"{where}: parameter {param.name}")
        if param.name in notes:
            schema = {**schema, "description": notes[param.name]}
        properties[param.name] = schema
        if param.default is param.empty and not nullable:
            required.append(param.name)
        elif param.default is param.empty:
            optional.append(param.name)  # Optional without a default: None when the model leaves it out
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required

    def run(arguments: dict) -> str:
        try:
            bound = signature.bind(**{**{name: None for name in optional}, **arguments})
        except TypeError as exc:
            return f"error: {exc}"
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):  # the chat's stdout holds only answers
                value = fn(*bound.args, **bound.kwargs)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a failing tool is a result, not a crash
            said = printed.getvalue().rstrip("\n")
            return clip(f"error: {type(exc).__name__}: {exc}" + (f"\n{said}" if said else ""))
        parts = [printed.getvalue().rstrip("\n")] if printed.getvalue() else []
        if value is not None:
            parts.append(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))
        return clip("\n".join(parts) or "(no output)")

    return Tool(fn.__name__, description, parameters, run, str(path))


def _schema(annotation: Any, where: str) -> tuple[dict, bool]:
    """The JSON schema of one annotation, and whether it admits None (Optional[X], X | None)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in SCALARS:
        return {"type": SCALARS[annotation]}, False
    if annotation is list or origin is list:
        return ({"type": "array", "items": _schema(args[0], where)[0]} if args else {"type": "array"}), False
    if annotation is dict or origin is dict:
        return {"type": "object"}, False
    if origin is Literal:
        kinds = {SCALARS.get(type(value)) for value in args}
        if None in kinds or not args:
            raise ToolFileError(f"{where}: Literal values must be str, int, float or bool, got {annotation!r}")
        schema: dict[str, Any] = {"enum": list(args)}
        return ({"type": kinds.pop(), **schema} if len(kinds) == 1 else schema), False
    if origin in (Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        schemas = [_schema(arg, where)[0] for arg in kept]
        return (schemas[0] if len(schemas) == 1 else {"anyOf": schemas}), len(kept) < len(args)
    raise ToolFileError(f"{where}: unsupported annotation {_name(annotation)}: use {SUPPORTED}")


def _name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else repr(annotation)


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (the text before an `Args:` section) and each parameter's line in that section."""
    parts = re.split(r"^\s*(?:Args|Arguments|Parameters):\s*$", doc, maxsplit=1, flags=re.M)
    head, section = parts[0], parts[1] if len(parts) > 1 else ""
    notes: dict[str, str] = {}
    last = None
    for line in section.splitlines():
        match = re.match(r"^\s*(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", line)
        if match:
            last = match.group(1)
            notes[last] = match.group(3).strip()
        elif last and line.strip():
            notes[last] += " " + line.strip()
        elif not line.strip():
            last = None
    return head.strip(), notes


# -- shell commands ----------------------------------------------------------------------------------------


def _shell_tools(path: Path) -> list[Tool]:
    toml = path.suffix.lower() == ".toml"
    try:
        text = path.read_text(encoding="utf-8")
        if not toml:
            data = json.loads(text)
        elif sys.version_info >= (3, 11):
            import tomllib

            data = tomllib.loads(text)  # its TOMLDecodeError is a ValueError
        else:
            raise ToolFileError(f"{path}: TOML tool files need Python 3.11 or later (tomllib): write it as .json")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolFileError(f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise ToolFileError(f"{path}: not valid {'TOML' if toml else 'JSON'}: {exc}") from None
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ToolFileError(f'{path}: expected a list of tools under "tools" ([[tools]] tables in TOML)')
    return [_shell_tool(entry, i, path) for i, entry in enumerate(entries)]


def _shell_tool(entry: Any, index: int, path: Path) -> Tool:
    where = f"{path}: tool {index + 1}"
    if not isinstance(entry, dict):
        raise ToolFileError(f"{where}: each tool is a table of {', '.join(sorted(SHELL_KEYS))}")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ToolFileError(f"{where}: a tool's name is 1 to 64 letters, digits, _ or -, got {name!r}")
    where = f"{path}: tool {name}"
    unknown = sorted(set(entry) - SHELL_KEYS)
    if unknown:
        raise ToolFileError(f"{where}: unknown key(s) {', '.join(unknown)}: a tool has {', '.join(sorted(SHELL_KEYS))}")
    description = entry.get("description", "")
    if not isinstance(description, str):
        raise ToolFileError(f"{where}: description must be text")
    command = entry.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(item, str) for item in command):
        raise ToolFileError(f'{where}: command must be a list of strings, the program first: ["grep", "-n", "{{x}}"]')
    fields = [_placeholders(item, f"{where}: command item {item!r}") for item in command]
    if fields[0]:
        raise ToolFileError(f"{where}: the program ({command[0]!r}) cannot be a placeholder")
    if os.sep not in command[0] and shutil.which(command[0]) is None:
        raise ToolFileError(f"{where}: the program {command[0]!r} is not on PATH")
    used = {name for found in fields for name in found}
    parameters = entry.get("parameters")
    if parameters is None:  # every placeholder a required string
        ordered = sorted(used)
        parameters = {"type": "object", "properties": {p: {"type": "string"} for p in ordered}, "required": ordered}
    props = parameters.get("properties", {}) if isinstance(parameters, dict) else None
    if not isinstance(props, dict) or parameters.get("type", "object") != "object":
        raise ToolFileError(f'{where}: parameters must be a JSON schema of an object: {{"type": "object", ...}}')
    bad, unused = sorted(used - set(props)), sorted(set(props) - used)
    if bad:
        known = ", ".join(props) or "it has none"
        raise ToolFileError(f"{where}: bad placeholder {{{bad[0]}}}: not one of its parameters ({known})")
    if unused:
        raise ToolFileError(f"{where}: parameter {unused[0]} is in no {{placeholder}} of the command")
    timeout = entry.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise ToolFileError(f"{where}: timeout is seconds, more than 0 and at most {MAX_TIMEOUT:g}, got {timeout!r}")
    return Tool(
        name, description, {"type": "object", **parameters}, lambda args: run_command(command, args, timeout), str(path)
    )


def _placeholders(item: str, where: str) -> list[str]:
    """The parameter names an argv item's `{name}`s use (`{{` and `}}` are braces)."""
    try:
        parsed = list(string.Formatter().parse(item))
    except ValueError as exc:
        raise ToolFileError(f"{where}: bad placeholder: {exc} (a literal brace is {{{{ or }}}})") from None
    names = []
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", field) or spec or conversion:
            raise ToolFileError(f"{where}: bad placeholder {{{field}{'!' + conversion if conversion else ''}}}")
        names.append(field)
    return names


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)  # true / false / numbers / lists / objects as JSON


def command_argv(command: list[str], arguments: dict) -> list[str]:
    """The argv of one call: each placeholder replaced by its argument's text, never through a shell."""
    argv = [command[0]]
    for item in command[1:]:
        names = [field for _, field, _, _ in string.Formatter().parse(item) if field is not None]
        if any(arguments.get(name) is None for name in names):
            continue  # an optional parameter left out: its item goes too
        if len(names) == 1 and item == "{" + names[0] + "}" and isinstance(arguments[names[0]], list):
            argv += [_text(value) for value in arguments[names[0]]]
            continue
        argv.append(item.format_map({name: _text(arguments[name]) for name in names}))
    return argv


def run_command(command: list[str], arguments: dict, timeout: float) -> str:
    """Run one call's argv; its output (stderr after stdout), or the error text on a failure."""
    unknown = sorted(set(arguments) - {f for item in command for _, f, _, _ in string.Formatter().parse(item) if f})
    if unknown:
        return f"error: unknown argument(s) {', '.join(unknown)}"
    argv = command_argv(command, arguments)
    try:  # a session of its own: a timeout ends the command's children too
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
    except OSError as exc:
        return f"error: cannot run {argv[0]}: {exc.strerror or exc}"
    try:
        out, err = process.communicate(timeout=timeout)
        note = f"error: exit status {process.returncode}\n" if process.returncode else ""
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        note = f"error: timed out after {timeout:g} s\n"
    except BaseException:  # Ctrl-C: the command does not outlive the turn
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    text = out.decode("utf-8", "replace") + (f"[stderr]\n{err.decode('utf-8', 'replace')}" if err else "")
    return clip(note + text if note or text else "(no output)")
