"""`flashdesk chat`: a terminal chat like `ollama run`, and its `--jsonl` twin for scripts.

Every turn re-renders the whole conversation with the chat template and sends it to the engine,
which reuses the longest prefix it still holds from the previous turn and prefills only the rest
(`--no-reuse` prefills everything, for comparison). `fit_conversation` fits each turn into the
context first: it drops the oldest turns (keeping the system prompt) or refuses the turn.

Interactive mode streams the answer to stdout and everything else (thoughts, notes, the stats
line, command replies, errors) to stderr, so `flashdesk chat ... > answers.txt` keeps only answers.
`--jsonl` prints exactly one JSON object per request line on stdout and nothing else.

`--tools FILE` lets the model call the user's Python functions or shell commands (tool_files.py):
each call is shown and runs only once the user says yes (or with `--yes`), and its result goes back
to the model, round after round, until it answers in text (tool_loop.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from flashdesk.engine.decode.conversation import check_policy, fit_conversation
from flashdesk.engine.decode.speculative import AUTO
from flashdesk.engine.decode.tool_calls import CallSplitter, with_marks
from flashdesk.engine.errors import ContextOverflowError, FlashDeskError

COMMANDS = {
    "spec": "/spec on|off        speculative decoding on or off (needs --draft)",
    "k": "/k N|auto           draft length, 1..the draft model's longest, or chosen each step (needs --draft)",
    "method": "/method NAME        dflash, mtp or auto: which loaded draft model drafts (auto: each step the fastest)",
    "think": "/think on|off       let the model think before answering",
    "system": "/system TEXT        set or replace the system prompt (/system alone clears it)",
    "regenerate": "/regenerate         drop the last reply and answer the last message again",
    "clear": "/clear              forget the conversation, keep the system prompt",
    "stats": "/stats              the session's totals and the last turn's stats",
    "save": "/save FILE          write the conversation (messages + settings) as JSON",
    "help": "/help               this list",
    "bye": "/bye, /quit         leave (Ctrl-D too; Ctrl-C stops a reply)",
}
ALIASES = {"quit": "bye", "exit": "bye", "?": "help", "regen": "regenerate"}
_ON = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


class CommandError(ValueError):
    """A bad command or argument: said in one line, and the session goes on with nothing lost."""


@dataclass
class Reply:
    """One answered turn: `generate --json`'s fields plus what the conversation did to fit."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    thought: str
    finish_reason: str
    steps: list[dict]
    stats: dict
    dropped_messages: int
    regenerated: bool = False
    calls: list = field(default_factory=list)  # this round's ToolCalls (tool_loop.py)
    tool_calls: list[dict] = field(default_factory=list)  # every call of the message, its result with it
    rounds: int = 1
    note: str | None = None  # what the tool loop did that the user should know

    def to_json(self) -> dict:
        out = {
            "prompt_ids": self.prompt_ids,
            "token_ids": self.token_ids,
            "text": self.text,
            "thought": self.thought,
            "finish_reason": self.finish_reason,
            "steps": self.steps,
            "stats": self.stats,
            "dropped_messages": self.dropped_messages,
        }
        if self.regenerated:
            out["regenerated"] = True
        if self.tool_calls or self.rounds > 1:
            out |= {"tool_calls": self.tool_calls, "rounds": self.rounds}
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class Totals:
    turns: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    generated_tokens: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    speculative_steps: int = 0
    speculative_emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    dropped_messages: int = 0
    cancelled: int = 0
    last: dict | None = field(default=None)

    def add(self, reply: Reply) -> None:
        s = reply.stats
        self.turns += 1
        self.prompt_tokens += s["prompt_tokens"]
        self.reused_tokens += s["reused_tokens"]
        self.prefill_tokens += s["prefill_tokens"]
        self.prefill_seconds += s["prefill_seconds"]
        self.generated_tokens += len(reply.token_ids)
        self.decode_tokens += s["decode_tokens"]
        self.decode_seconds += s["decode_seconds"]
        self.speculative_steps += s["speculative_steps"]
        self.speculative_emitted += s["speculative_emitted"]
        self.drafted += s["drafted"]
        self.accepted += s["accepted"]
        self.dropped_messages += reply.dropped_messages
        self.last = {
            "finish_reason": reply.finish_reason,
            "dropped_messages": reply.dropped_messages,
            "generated_tokens": len(reply.token_ids),
            **s,
        }

    def summary(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "last"}
        out["decode_tokens_per_second"] = self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0
        out["acceptance_rate"] = self.accepted / self.drafted if self.drafted else None
        out["mean_acceptance_length"] = (
            self.speculative_emitted / self.speculative_steps if self.speculative_steps else None
        )
        out["last"] = self.last
        return out


def _switch(value, what: str) -> bool:
    if isinstance(value, bool):
        return value
    key = str(value).strip().lower() if value is not None else ""
    if key not in _ON:
        raise CommandError(f"/{what} takes on or off, got {value!r}" if key else f"/{what} needs on or off")
    return _ON[key]


class ChatSession:
    """The conversation and its settings, over a loaded engine. Front ends (the terminal, --jsonl)
    call `send`, `regenerate` and `command`; a turn that fails or is interrupted leaves the history
    as it was."""

    def __init__(
        self,
        engine,
        control,
        *,
        system: str | None,
        thinking: bool,
        sampling,
        max_new_tokens: int,
        ignore_eos: bool,
        stop_strings: tuple[str, ...],
        reuse: bool,
        policy: str,
        model: str | None = None,
        draft: str | None = None,
        toolbox=None,
    ):
        if engine.tokenizer is None:
            raise FlashDeskError(
                f"{model or 'the model folder'} has no tokenizer: chat needs tokenizer.json and a chat template"
            )
        if max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
        self.engine, self.control = engine, control
        self.system = system or None
        self.thinking = thinking
        self.sampling, self.max_new_tokens, self.ignore_eos = sampling, max_new_tokens, ignore_eos
        self.stop_strings, self.reuse, self.policy = tuple(stop_strings), reuse, check_policy(policy)
        self.model, self.draft = model, draft
        self.toolbox = toolbox  # tool_loop.ToolBox, or None: no tools
        self.history: list[dict] = []  # user and assistant messages, the system prompt apart
        self.totals = Totals()

    # -- the conversation ------------------------------------------------------------------------

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def send(self, text: str, on_step=None, on_fit=None, on_call=None) -> Reply:
        """Add a user message and answer it. On any failure (context, Ctrl-C) the message is taken back,
        with the rounds of tool calls it led to. `on_call(call)` runs or declines each tool call."""
        if not text.strip():
            raise CommandError("the message is empty")
        before = self.history
        self.history = before + [{"role": "user", "content": text}]
        try:
            return self._turn(on_step, on_fit, on_call)
        except BaseException:
            self.history = before
            raise

    def regenerate(self, on_step=None, on_fit=None, on_call=None) -> Reply:
        """Drop the last reply (its tool calls too) and answer the last user message again; on failure
        the old reply stays."""
        users = [i for i, m in enumerate(self.history) if m["role"] == "user"]
        if not users or users[-1] == len(self.history) - 1:
            raise CommandError("nothing to regenerate: there is no reply yet")
        before = self.history
        self.history = before[: users[-1] + 1]
        try:
            reply = self._turn(on_step, on_fit, on_call)
        except BaseException:
            self.history = before
            raise
        reply.regenerated = True
        return reply

    def _turn(self, on_step, on_fit, on_call) -> Reply:
        """Answer the last user message: with tools, round after round while the model calls them."""
        if self.toolbox is None:
            return self._answer(on_step, on_fit)
        from flashdesk.engine.cli.tool_loop import MAX_ROUNDS

        done: list[dict] = []
        index = 0
        while True:
            shape = self.toolbox.shape(self.toolbox.round_choice(index), self.thinking)
            reply = self._answer(on_step, on_fit, shape)
            for call in reply.calls:
                if on_call is not None:
                    on_call(call)  # the front end asks the user, then runs or declines it
                if call.result is None:
                    call.decline()
                self.history.append(call.message())
                done.append(call.record())
            index += 1
            reply.tool_calls, reply.rounds = done, index
            if not reply.calls:  # an answer in text (the round after the last allowed one cannot call)
                break
        if index > MAX_ROUNDS:
            reply.note = f"{MAX_ROUNDS} rounds of tool calls, the limit per message: then it answered without tools"
        return reply

    def _answer(self, on_step, on_fit, shape=None) -> Reply:
        from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest

        try:
            fitted = fit_conversation(
                self.engine.tokenizer,
                self.messages(),
                thinking=self.thinking,
                context_limit=self.engine.context_limit,
                max_new_tokens=self.max_new_tokens,
                policy=self.policy,
                tools=self.toolbox.declared if self.toolbox is not None else None,
            )
        except ContextOverflowError as exc:
            hint = (
                "/clear starts over (the system prompt stays)"
                if self.policy == "drop_oldest"
                else "/clear starts over (the system prompt stays), --context-policy drop_oldest drops old turns"
            )
            raise ContextOverflowError(f"context full: {exc} [chat: {hint}]") from None
        if on_fit is not None:
            on_fit(fitted)
        sampling = self.sampling
        if shape is not None and shape.suppress:
            sampling = replace(sampling, suppress=tuple(sampling.suppress) + shape.suppress)
        request = GenerationRequest(
            fitted.ids,
            fitted.max_new_tokens,
            sampling,
            self.ignore_eos,
            self.stop_strings,
            reuse=self.reuse,
            grammar=shape.grammar if shape is not None else None,
            stop_ids=shape.stop_ids if shape is not None else (),
        )
        steps, finish, marked = [], None, []
        events = self.engine.generate(request, self.control)
        try:
            for event in events:
                if isinstance(event, FinishEvent):
                    finish = event
                    break
                if self.toolbox is not None and event.answer:
                    marked.append(with_marks(event.answer, event.controls))  # calls are read by token
                if event.index > 0:
                    step = {"emitted": event.emitted, "draft": event.draft, "accepted": event.accepted}
                    steps.append(step | ({"method": event.method} if event.method else {}))
                if on_step is not None:
                    on_step(event)
        except KeyboardInterrupt:
            self.totals.cancelled += 1
            raise
        finally:
            events.close()
        if finish is None:
            raise FlashDeskError("the engine's generation ended without its finish event")
        stats = dict(finish.stats)  # with reused_tokens + prefill_tokens = prompt_tokens
        text, calls, cut = finish.text, [], False
        if self.toolbox is not None:
            from flashdesk.engine.cli.tool_loop import assistant_message

            text, calls, cut = self.toolbox.read("".join(marked))
        reply = Reply(
            fitted.ids,
            finish.token_ids,
            text,
            finish.thought,
            fitted.finish_reason(finish.finish_reason, len(finish.token_ids)),
            steps,
            stats,
            fitted.dropped,
            calls=calls,
            note="the reply ended inside a tool call: that call was not run" if cut else None,
        )
        message = assistant_message(text, calls) if self.toolbox is not None else {"role": "assistant", "content": text}
        first = 1 if self.system else 0  # the history follows the fitted prompt: dropped turns stay dropped
        self.history = fitted.messages[first:] + [message]
        self.totals.add(reply)
        return reply

    # -- commands --------------------------------------------------------------------------------

    def settings(self) -> dict:
        spec = self.control is not None and self.control.enabled
        draft_length = None
        if self.control is not None:
            method = self.control.method or self.engine.method
            if self.control.draft_length or method == AUTO:
                draft_length = self.control.draft_length or AUTO
            elif method == self.engine.method:
                draft_length = self.engine.default_draft_length or self.engine.method_draft_length
            else:
                draft_length = self.engine.methods[method].default_draft_length
        return {
            "model": self.model,
            "draft": self.draft,
            "system": self.system,
            "thinking": self.thinking,
            "speculation": spec,
            "method": (self.control.method or self.engine.method) if self.control is not None else None,
            "draft_length": draft_length,
            "max_new_tokens": self.max_new_tokens,
            "ignore_eos": self.ignore_eos,
            "stop": list(self.stop_strings),
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "top_k": self.sampling.top_k,
            "seed": self.sampling.seed,
            "context_limit": self.engine.context_limit,
            "context_policy": self.policy,
            "reuse": self.reuse,
        } | (
            {"tools": list(self.toolbox.tools), "tool_choice": self.toolbox.choice} if self.toolbox is not None else {}
        )

    def _need_drafter(self, name: str) -> None:
        if self.control is None:
            raise CommandError(f"/{name} needs a draft model: start the chat with --draft DIR")

    def command(self, name: str, value=None) -> dict:
        """Run a command other than /regenerate; return what it did, for both front ends."""
        name = ALIASES.get(name, name)
        if name == "spec":
            self._need_drafter(name)
            self.control.enabled = _switch(value, name)
            return {"speculation": self.control.enabled, "draft_length": self.settings()["draft_length"]}
        if name == "k":
            self._need_drafter(name)
            longest = self.engine.max_draft_length
            try:
                if isinstance(value, bool):
                    raise ValueError
                text = str(value).strip().lower() if value is not None else ""
                k = AUTO if text == AUTO else int(text) if text else None
            except ValueError:
                k = None
            if k is None or (isinstance(k, int) and not 1 <= k <= longest):
                raise CommandError(
                    f"/k takes a draft length 1..{longest} or auto, got {value!r}"
                    if value is not None
                    else f"/k needs a draft length 1..{longest} or auto"
                )
            self.control.draft_length = k
            return {"draft_length": k, "speculation": self.control.enabled}
        if name == "method":
            self._need_drafter(name)
            loaded = list(self.engine.methods)
            choices = loaded + [AUTO] if len(loaded) > 1 else loaded
            method = str(value).strip().lower() if isinstance(value, str) else None
            if method not in choices:
                raise CommandError(
                    f"/method takes one of {', '.join(choices)} (the loaded draft models), got {value!r}"
                )
            self.control.method = method
            return {"method": method, "speculation": self.control.enabled}
        if name == "think":
            self.thinking = _switch(value, name)
            return {"thinking": self.thinking}
        if name == "system":
            if value is not None and not isinstance(value, str):
                raise CommandError("/system takes text")
            self.system = value.strip() if value and value.strip() else None
            return {"system": self.system}
        if name == "clear":
            self.history = []
            return {"system": self.system}
        if name == "stats":
            return {"messages": len(self.history), **self.totals.summary()}
        if name == "save":
            if not isinstance(value, str) or not value.strip():
                raise CommandError("/save needs a file name")
            path = Path(value.strip()).expanduser()
            document = {"messages": self.messages(), "settings": self.settings(), "stats": self.totals.summary()}
            try:
                path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None
            return {"path": str(path), "messages": len(document["messages"])}
        if name == "help":
            return {"commands": list(COMMANDS.values())}
        if name == "bye":
            return {}
        raise CommandError(f"unknown command /{name}: /help lists the commands")


def _split_command(text: str) -> tuple[str, str | None]:
    """'/k 4' -> ('k', '4'); '/clear' -> ('clear', None)."""
    name, _, rest = text.strip().lstrip("/").partition(" ")
    return name.strip().lower(), (rest.strip() or None)


# -- the terminal ---------------------------------------------------------------------------------


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class _Stream:
    """Streams one reply: the answer to stdout, thoughts to stderr between markers; with tools, the
    calls' markup is cut out (each call is shown when it is confirmed)."""

    def __init__(self, tools: bool = False):
        self.thinking = False
        self.wrote = False
        self.tools = tools
        self.splitter = CallSplitter(marked=True)

    def fit(self, fitted) -> None:
        if fitted.dropped:
            _err(f"[context full: dropped the {fitted.dropped} oldest message(s), the system prompt kept]")

    def step(self, event) -> None:
        if event.thought:
            if not self.thinking:
                sys.stderr.write("[thinking]\n")
                self.thinking = True
            sys.stderr.write(event.thought)
            sys.stderr.flush()
        answer = self.splitter.push(with_marks(event.answer, event.controls)).text if self.tools else event.answer
        if answer:
            self._end_thought()
            sys.stdout.write(answer)
            sys.stdout.flush()
            self.wrote = True

    def _end_thought(self) -> None:
        if self.thinking:
            sys.stderr.write("\n[/thinking]\n")
            sys.stderr.flush()
            self.thinking = False

    def end(self) -> None:
        """The end of a reply, or of one round of a tool loop (a round that only called writes no line)."""
        self._end_thought()
        tail = self.splitter.finish().text
        self.splitter = CallSplitter(marked=True)
        if self.tools and not (self.wrote or tail):
            return
        sys.stdout.write(tail + "\n")
        sys.stdout.flush()
        self.wrote = False

    def call(self, call, yes: bool) -> None:
        """One tool call: shown, then run if the user says yes (or with --yes), else declined."""
        self.end()
        _err(f"[tool call] {call.shown()}")
        if yes or _ask("run it? [y/N] "):
            result = call.run()
            _err(f"[tool result] {result if len(result) <= 400 else result[:400] + ' ...'}")
        else:
            call.decline()
            _err("[declined: the model is told so]")


def _ask(question: str) -> bool:
    """A yes/no question on the terminal (stdin): only y or yes is a yes; the end of input is a no."""
    sys.stderr.write(question)
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        _err(answer.strip())
    return answer.strip().lower() in ("y", "yes")


def stats_line(reply: Reply) -> str:
    s = reply.stats
    tau = s.get("mean_acceptance_length")
    parts = [
        f"ttft {s['prefill_seconds']:.2f} s",
        f"{len(reply.token_ids)} tokens at {s['decode_tokens_per_second']:.1f} tok/s",
        f"tau {tau:.2f}" if tau is not None else "tau -",
        f"reused {s['reused_tokens']}",
        f"prefilled {s['prefill_tokens']}",
    ]
    if reply.finish_reason != "stop":
        parts.append(f"finish: {reply.finish_reason}")
    if reply.rounds > 1:
        parts.append(f"{reply.rounds} rounds, {len(reply.tool_calls)} tool call(s)")
    return "[" + ", ".join(parts) + "]"


def _describe(name: str, result: dict) -> str:
    name = ALIASES.get(name, name)
    if name == "spec":
        return f"speculation on (draft length {result['draft_length']})" if result["speculation"] else "speculation off"
    if name == "k":
        note = "" if result["speculation"] else " (speculation is off: /spec on uses it)"
        return f"draft length {result['draft_length']}{note}"
    if name == "think":
        return f"thinking {'on' if result['thinking'] else 'off'}"
    if name == "system":
        return "system prompt set" if result["system"] else "system prompt cleared"
    if name == "clear":
        return "conversation cleared" + (" (system prompt kept)" if result["system"] else "")
    if name == "save":
        return f"saved {result['messages']} message(s) to {result['path']}"
    if name == "help":
        return "\n".join(result["commands"]) + "\nAnything else is a message to the model."
    if name == "stats":
        tau = result["mean_acceptance_length"]
        lines = [
            f"turns {result['turns']} (cancelled {result['cancelled']}), messages {result['messages']}",
            f"prompt tokens {result['prompt_tokens']}: reused {result['reused_tokens']}, "
            f"prefilled {result['prefill_tokens']} in {result['prefill_seconds']:.2f} s",
            f"generated {result['generated_tokens']} tokens, decode {result['decode_tokens_per_second']:.1f} "
            f"tok/s, mean tau {'-' if tau is None else f'{tau:.2f}'}",
            f"dropped messages {result['dropped_messages']}",
        ]
        if result["last"]:
            last = result["last"]
            ltau = last.get("mean_acceptance_length")
            lines.append(
                f"last turn: {last['generated_tokens']} tokens, ttft {last['prefill_seconds']:.2f} s, "
                f"{last['decode_tokens_per_second']:.1f} tok/s, tau {'-' if ltau is None else f'{ltau:.2f}'}"
                f", reused {last['reused_tokens']}, prefilled {last['prefill_tokens']}, "
                f"finish {last['finish_reason']}"
            )
        return "\n".join(lines)
    return "ok"


def _interactive(session: ChatSession, yes: bool = False) -> int:
    tty = sys.stdin.isatty()
    if tty:
        _err("flashdesk chat: /help lists the commands, /bye or Ctrl-D leaves, Ctrl-C stops a reply")
        if session.engine.default_note and session.control is not None and not session.control.draft_length:
            _err(f"draft length {session.engine.default_note} (/k N or /k auto changes it)")
    while True:
        if tty:
            sys.stderr.write(">>> ")
            sys.stderr.flush()
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            _err("")
            return 0
        if not line:  # Ctrl-D, or the end of piped input
            if tty:
                _err("")
            return 0
        text = line.rstrip("\n")
        if not text.strip():
            continue
        stream = _Stream(tools=session.toolbox is not None)

        def on_call(call, stream=stream) -> None:
            stream.call(call, yes)

        try:
            if text.lstrip().startswith("/"):
                name, value = _split_command(text)
                name = ALIASES.get(name, name)
                if name == "bye":
                    return 0
                if name != "regenerate":
                    _err(_describe(name, session.command(name, value)))
                    continue
                if value is not None:
                    raise CommandError("/regenerate takes no argument")
                reply = session.regenerate(stream.step, stream.fit, on_call)
            else:
                reply = session.send(text, stream.step, stream.fit, on_call)
        except KeyboardInterrupt:
            stream.end()
            what = "partial reply and its tool calls" if session.toolbox is not None else "partial reply"
            _err(f"[cancelled: the message and its {what} are left out of the history]")
            continue
        except (FlashDeskError, ValueError) as exc:  # CommandError, context full, bad request
            _err(f"error: {exc}")
            continue
        stream.end()
        if reply.note:
            _err(f"[{reply.note}]")
        _err(stats_line(reply))


def _parse_request(line: str) -> tuple[str, object]:
    """A --jsonl line -> ('user', text) or (command name, value)."""
    try:
        request = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CommandError(f"not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise CommandError('each line must be a JSON object: {"user": TEXT} or {"command": NAME, "value": ...}')
    if ("user" in request) == ("command" in request):
        raise CommandError('give exactly one of "user" and "command"')
    if "user" in request:
        if not isinstance(request["user"], str):
            raise CommandError('"user" must be a string')
        return "user", request["user"]
    command = request["command"]
    if not isinstance(command, str) or not command.strip():
        raise CommandError('"command" must be a command name such as "regenerate" or "k 4"')
    name, inline = _split_command(command)
    if inline is not None and "value" in request:
        raise CommandError(f'the command {command!r} has both an inline argument and a "value"')
    return ALIASES.get(name, name), request.get("value", inline)


def _run(call) -> None:
    """--jsonl runs every call (run_chat asks for --yes): there is no one to ask."""
    call.run()


def _jsonl(session: ChatSession) -> int:
    def emit(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        name = None
        try:
            name, value = _parse_request(line)
            if name == "user":
                assert isinstance(value, str)  # _parse_request checked it
                emit(session.send(value, on_call=_run).to_json())
            elif name == "regenerate":
                if value is not None:
                    raise CommandError("regenerate takes no value")
                emit(session.regenerate(on_call=_run).to_json())
            else:
                result = session.command(name, value)
                emit({"command": name, "ok": True, **result})
                if name == "bye":
                    return 0
        except (FlashDeskError, ValueError) as exc:
            error = {"error": str(exc)}
            if name not in (None, "user"):
                error["command"] = name
            emit(error)
    return 0


def run_chat(args) -> int:
    from flashdesk.engine.cli.cli_args import load_engine, sampling_from

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    sampling = sampling_from(args)
    yes = bool(getattr(args, "yes", False))
    tools = _tool_files(args, yes)  # a bad tool file is said before the model loads
    engine, control = load_engine(args)
    toolbox = None
    if tools:
        from flashdesk.engine.cli.tool_loop import ToolBox

        if engine.tokenizer is None:
            raise FlashDeskError(f"{args.model}: no tokenizer, so no tools: --tools needs the model's chat template")
        toolbox = ToolBox(tools, engine.tokenizer, args.tool_choice)
        asks = "--yes: each call runs without asking" if yes else "each call is shown and asks y/N first"
        _err(f"[tools: {', '.join(toolbox.tools)}; --tool-choice {toolbox.choice}; {asks}]")
    session = ChatSession(
        engine,
        control,
        system=args.system,
        thinking=args.thinking,
        sampling=sampling,
        max_new_tokens=args.max_new_tokens,
        ignore_eos=args.ignore_eos,
        stop_strings=tuple(args.stop),
        reuse=not args.no_reuse,
        policy=args.context_policy,
        model=args.model,
        draft=args.draft,
        toolbox=toolbox,
    )
    return _jsonl(session) if args.jsonl else _interactive(session, yes)


def _tool_files(args, yes: bool) -> list:
    """The tools of --tools, with the flags that go with them checked."""
    paths, choice = getattr(args, "tools", None) or [], getattr(args, "tool_choice", "auto")
    if not paths:
        if choice != "auto" or yes:
            raise ValueError("--tool-choice and --yes go with --tools FILE")
        return []
    if args.ignore_eos:
        raise ValueError("--ignore-eos cannot go with --tools: a tool call ends its reply")
    if args.jsonl and not yes:
        raise ValueError("--jsonl with --tools needs --yes: there is no one to confirm each call")
    from flashdesk.engine.cli.tool_files import load_tools
    from flashdesk.engine.cli.tool_loop import check_choice

    tools = load_tools(paths)
    check_choice(choice, [tool.name for tool in tools])
    return tools
