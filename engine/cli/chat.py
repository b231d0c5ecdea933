"""`flashdesk chat`: a terminal chat like `ollama run`, and its `--jsonl` twin for scripts.

Every turn re-renders the whole conversation with the chat template and sends it to the engine,
which reuses the longest prefix it still holds from the previous turn and prefills only the rest
(`--no-reuse` prefills everything, for comparison). `fit_conversation` fits each turn into the
context first: it drops the oldest turns (keeping the system prompt) or refuses the turn.

Interactive mode streams the answer to stdout and everything else (thoughts, notes, the stats
line, command replies, errors) to stderr, so `flashdesk chat ... > answers.txt` keeps only answers.
`--jsonl` prints exactly one JSON object per request line on stdout and nothing else.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from flashdesk.engine.decode.conversation import check_policy, fit_conversation
from flashdesk.engine.decode.speculative import AUTO
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
        self.history: list[dict] = []  # user and assistant messages, the system prompt apart
        self.totals = Totals()

    # -- the conversation ------------------------------------------------------------------------

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def send(self, text: str, on_step=None, on_fit=None) -> Reply:
        """Add a user message and answer it. On any failure (context, Ctrl-C) the message is taken back."""
        if not text.strip():
            raise CommandError("the message is empty")
        self.history.append({"role": "user", "content": text})
        try:
            return self._answer(on_step, on_fit)
        except BaseException:
            self.history.pop()
            raise

    def regenerate(self, on_step=None, on_fit=None) -> Reply:
        """Drop the last reply and answer the last user message again; on failure the old reply stays."""
        if not self.history or self.history[-1]["role"] != "assistant":
            raise CommandError("nothing to regenerate: there is no reply yet")
        old = self.history.pop()
        try:
            reply = self._answer(on_step, on_fit)
        except BaseException:
            self.history.append(old)
            raise
        reply.regenerated = True
        return reply

    def _answer(self, on_step, on_fit) -> Reply:
        from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest

        try:
            fitted = fit_conversation(
                self.engine.tokenizer,
                self.messages(),
                thinking=self.thinking,
                context_limit=self.engine.context_limit,
                max_new_tokens=self.max_new_tokens,
                policy=self.policy,
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
        request = GenerationRequest(
            fitted.ids, fitted.max_new_tokens, self.sampling, self.ignore_eos, self.stop_strings, reuse=self.reuse
        )
        steps, finish = [], None
        events = self.engine.generate(request, self.control)
        try:
            for event in events:
                if isinstance(event, FinishEvent):
                    finish = event
                    break
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
        reply = Reply(
            fitted.ids,
            finish.token_ids,
            finish.text,
            finish.thought,
            fitted.finish_reason(finish.finish_reason, len(finish.token_ids)),
            steps,
            stats,
            fitted.dropped,
        )
        first = 1 if self.system else 0  # the history follows the fitted prompt: dropped turns stay dropped
        self.history = fitted.messages[first:] + [{"role": "assistant", "content": finish.text}]
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
        }

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
    """Streams one reply: the answer to stdout, thoughts to stderr between markers."""

    def __init__(self):
        self.thinking = False
        self.wrote = False

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
        if event.answer:
            self._end_thought()
            sys.stdout.write(event.answer)
            sys.stdout.flush()
            self.wrote = True

    def _end_thought(self) -> None:
        if self.thinking:
            sys.stderr.write("\n[/thinking]\n")
            sys.stderr.flush()
            self.thinking = False

    def end(self) -> None:
        self._end_thought()
        sys.stdout.write("\n")
        sys.stdout.flush()


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


def _interactive(session: ChatSession) -> int:
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
        stream = _Stream()
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
                reply = session.regenerate(stream.step, stream.fit)
            else:
                reply = session.send(text, stream.step, stream.fit)
        except KeyboardInterrupt:
            stream.end()
            _err("[cancelled: the message and its partial reply are left out of the history]")
            continue
        except (FlashDeskError, ValueError) as exc:  # CommandError, context full, bad request
            _err(f"error: {exc}")
            continue
        stream.end()
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
                emit(session.send(value).to_json())
            elif name == "regenerate":
                if value is not None:
                    raise CommandError("regenerate takes no value")
                emit(session.regenerate().to_json())
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
    from flashdesk.engine.decode.sampling import SamplingParams
    from flashdesk.engine.cli.cli_args import load_engine

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed)
    engine, control = load_engine(args)
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
    )
    return _jsonl(session) if args.jsonl else _interactive(session)
