"""How much of the context the conversation takes, as you type, and whether a send goes past it.

Why apart: the message box shows "N / LIMIT tokens" for the conversation plus the text being typed,
and a send past the limit is warned about before it goes. Both need the prompt's exact length,
which only the engine's tokenizer and chat template know, so the worker counts (CountTokens, which
it answers at once, also while a reply streams); this keeps the debounce, the latest count, and the
check before a send. No widgets: the window shows what the signals say.

"Past the limit" is the engine's own rule (engine/decode/conversation.py, which the app may not
import): a turn must leave its reply `reply_room` tokens, at least a quarter of the context or the
max new tokens asked if fewer; beyond that the engine drops the oldest turns or refuses the turn.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from PySide6.QtCore import QObject, QTimer, Signal

from flashdesk.app.backends.engine_session import READY, EngineSession
from flashdesk.app.chat.settings_dialog import STOP

DEBOUNCE_MS = 250
REPLY_SHARE = 4  # as engine/decode/conversation.py: a turn leaves its reply at least 1/4 of the context
NEAR_SHARE = 0.85  # the gauge turns to the warning colour at this share of the usable context
OK, NEAR, OVER = "ok", "near", "over"


def reply_room(context_limit: int, max_tokens: int) -> int:
    """The room a turn must leave for its reply (the engine's rule)."""
    return max(1, min(max_tokens, context_limit // REPLY_SHARE))


@dataclass(frozen=True)
class Count:
    tokens: int  # the prompt: the conversation, the text typed as the next user message, the template
    context_limit: int
    max_tokens: int  # the conversation's max new tokens
    messages: tuple  # what was counted (to know whether a count is still current)
    thinking: bool
    left_out: int = 0  # the oldest messages not counted: the engine already leaves them out
    by_itself: int | None = None  # over the context: the message with the system prompt alone (None: not counted)
    live: bool = False  # a reply streams: `tokens` is its prompt and what it wrote so far

    @property
    def room(self) -> int:
        return reply_room(self.context_limit, self.max_tokens)

    @property
    def usable(self) -> int:
        """The longest prompt the engine takes as it is (a streaming reply may fill all of it)."""
        return self.context_limit if self.live else self.context_limit - self.room

    @property
    def level(self) -> str:
        if self.tokens > self.usable:
            return OVER
        return NEAR if self.tokens >= NEAR_SHARE * self.usable else OK

    @property
    def over(self) -> bool:
        return self.level == OVER

    @property
    def only_message(self) -> bool:
        """Whether the message being sent is the conversation's only one (a system prompt aside)."""
        return not self.left_out and sum(1 for m in self.messages if m.get("role") != "system") == 1

    @property
    def alone(self) -> bool:
        """Whether the message is too long for the context by itself: leaving every older turn out
        would not make room (it is the only one, or counted alone it is still over)."""
        if self.only_message:
            return True
        return self.by_itself is not None and self.by_itself > self.usable

    def text(self) -> str:
        return f"{self.tokens:,} / {self.context_limit:,} tokens"

    def tooltip(self, policy: str) -> str:
        if self.live:
            return (
                f"The reply being written and its prompt take {self.tokens:,} tokens of the context's "
                f"{self.context_limit:,}."
            )
        then = (
            "the engine refuses the turn (Stop and tell me, in Settings)"
            if policy == STOP
            else "the oldest turns are left out of the prompt (the system prompt stays)"
        )
        left = (
            f" The oldest {self.left_out:,} message{'s are' if self.left_out != 1 else ' is'} already left out "
            "(the last reply dropped them to fit) and not counted."
            if self.left_out
            else ""
        )
        return (
            f"The conversation with this message makes a prompt of {self.tokens:,} tokens, of a context of "
            f"{self.context_limit:,}; {self.room:,} are kept for the reply. Past {self.usable:,}, {then}.{left}"
        )

    def warning(self, policy: str) -> str:
        """What sending this will do, for the banner before it goes."""
        if self.alone:
            needs = self.tokens if self.only_message else self.by_itself
            older = (
                "there are no older turns to leave out"
                if self.only_message
                else "leaving the older turns out would not make room"
            )
            return (
                f"<b>This message is too long for the context by itself.</b> With the reply's "
                f"{self.room:,} tokens it needs {needs + self.room:,} of the context's "
                f"{self.context_limit:,}, and {older}. Trim it to what fits, shorten "
                "it (or lower Max new tokens in the conversation's settings); it stays in the message box."
            )
        head = (
            f"<b>This message takes the conversation past the context.</b> The prompt would be "
            f"{self.tokens:,} tokens and the reply needs {self.room:,} more, over the {self.context_limit:,} "
            "tokens of the context. "
        )
        if policy == STOP:
            return head + (
                "Your setting is to stop: the engine will refuse this turn. Start a new conversation "
                "with the same system prompt, or drop the oldest turns this once."
            )
        return head + (
            "The oldest turns will be left out of the prompt to fit (the system prompt stays, and "
            "this conversation keeps every message)."
        )


def trimmed_to_fit(text: str, count: Count, margin: float = 0.92) -> str:
    """The start of `text` that fits the context by itself, cut at a paragraph, line or word break:
    its share of the characters is what fits of the count's tokens (less a margin, as tokens per
    character vary), so the next count confirms it fits, or a second trim takes a little more."""
    tokens = count.tokens if count.only_message or count.by_itself is None else count.by_itself
    share = max(0.0, min(1.0, margin * count.usable / max(1, tokens)))
    end = int(len(text) * share)
    for mark in ("\n\n", "\n", " "):
        at = text.rfind(mark, 0, end)
        if at > end * 0.8:
            return text[:at].rstrip()
    return text[:end].rstrip()


def refused_text(reason: str, text_back: bool) -> str:
    """The banner's words for a turn the engine refused."""
    back = " Your message is back in the message box." if text_back else ""
    return f"<b>Not sent.</b> {reason.rstrip('.')}.{back}"


def context_full_text(context_limit: int | None, remote: bool = False) -> str:
    """The banner's words after a reply that filled the context (a server is asked to go on with a
    "Continue." message: the OpenAI API has no way to continue a reply in place)."""
    where = f" ({context_limit:,} tokens)" if context_limit else ""
    how = (
        "(the server writes on in the same reply, where it can: vLLM, SGLang, llama.cpp and FlashDesk do; "
        "else a “Continue.” message asks it to)"
        if remote
        else "(the model writes on in the same reply, the oldest turns, and if need be the reply's own start, "
        "left out of its prompt)"
    )
    return (
        f"<b>The context filled up.</b> The reply stopped at the end of the context{where}. Continue it "
        f"{how}, or start a new conversation that keeps the system prompt."
    )


class ContextGauge(QObject):
    changed = Signal(object)  # Count, or None: no model, or the count is not known (hide the gauge)
    send_checked = Signal(str, object)  # text, Count (None: not counted, send and let the engine fit it)

    def __init__(
        self, session: EngineSession, prompt_messages, settings, left_out=lambda: 0, parent: QObject | None = None
    ):
        """`prompt_messages(text)` is the message list a send of `text` would make; `settings()` the
        conversation's sampling (max_tokens, thinking, context_policy); `left_out()` how many of the
        oldest messages the engine already leaves out (the last reply says), not counted."""
        super().__init__(parent)
        self.session = session
        self._all_messages = prompt_messages
        self.left_out = left_out
        self.settings = settings
        self.typed_text = ""
        self.last: Count | None = None
        self._gauge_request: str | None = None
        self._asked: dict[str, tuple[str, str, tuple, bool, int, int]] = {}  # rid -> (purpose, text, messages, ...)
        self._alone_checks: dict[str, tuple[str, Count]] = {}  # rid -> (text, the send's count)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self.count_now)
        session.token_count.connect(self._counted)
        session.state_changed.connect(self._state_changed)

    # -- the gauge ------------------------------------------------------------------------------------

    def typed(self, text: str) -> None:
        """The message box's text changed: count again once typing pauses."""
        self.typed_text = text
        self._timer.start()

    def refresh(self) -> None:
        """The conversation or its settings changed: count again soon."""
        self._timer.start()

    def prompt_messages(self, text: str) -> list[dict]:
        """What a send of `text` gives the engine, less the oldest messages it already leaves out:
        after a drop the gauge shows what the prompt holds, not the whole conversation."""
        return self._without_left_out(self._all_messages(text))

    def _without_left_out(self, messages: list[dict]) -> list[dict]:
        first = 1 if messages and messages[0].get("role") == "system" else 0
        skip = min(self.left_out(), max(0, len(messages) - first - 1))
        return messages[:first] + messages[first + skip :]

    def streaming(self, tokens: int) -> None:
        """A reply streams: show the context it fills as it grows (while the box is empty; typed
        text is counted with the conversation as usual)."""
        if self.typed_text.strip() or self.session.state != READY or self.session.info is None:
            return
        s = self.settings()
        count = Count(tokens, self.session.info.context_limit, int(s["max_tokens"]), (), bool(s["thinking"]), live=True)
        self.changed.emit(count)

    def count_now(self) -> None:
        self._timer.stop()
        if self.session.state != READY or self.session.info is None:
            self._gauge_request = None
            self.changed.emit(None)
            return
        rid = self._ask("gauge", self.typed_text)
        if rid is not None:
            self._gauge_request = rid

    # -- the check before a send --------------------------------------------------------------------------

    def check_send(self, text: str) -> None:
        """Emit send_checked(text, count) once the conversation with `text` is counted (at once when the
        last count is of exactly that)."""
        if self.session.state != READY or self.session.info is None:
            self.send_checked.emit(text, None)
            return
        s = self.settings()
        messages = tuple(self.prompt_messages(text))
        last = self.last
        if (
            last is not None
            and last.messages == messages
            and last.thinking == bool(s["thinking"])
            and last.max_tokens == int(s["max_tokens"])
        ):
            self._deliver("send", text, last)
            return
        if self._ask("send", text) is None:
            self.send_checked.emit(text, None)

    # -- counting -----------------------------------------------------------------------------------------

    def _ask(self, purpose: str, text: str) -> str | None:
        s = self.settings()
        everything = self._all_messages(text)
        messages = tuple(self._without_left_out(everything))
        thinking, max_tokens = bool(s["thinking"]), int(s["max_tokens"])
        left_out = len(everything) - len(messages)
        if not messages:  # nothing to count: an empty conversation and an empty box
            count = Count(0, self.session.info.context_limit, max_tokens, messages, thinking, left_out)
            self._deliver(purpose, text, count)
            return ""
        rid = self.session.count_tokens(list(messages), thinking)
        if rid is not None:
            self._asked[rid] = (purpose, text, messages, thinking, max_tokens, left_out)
        return rid

    def _counted(self, msg) -> None:
        alone = self._alone_checks.pop(msg.request_id, None)
        if alone is not None:  # the message alone, counted for a send over the context
            text, count = alone
            self._deliver("send", text, replace(count, by_itself=msg.tokens) if msg.tokens >= 0 else count)
            return
        entry = self._asked.pop(msg.request_id, None)
        if entry is None:
            return
        purpose, text, messages, thinking, max_tokens, left_out = entry
        count = None
        if msg.tokens >= 0:
            count = Count(msg.tokens, msg.context_limit, max_tokens, messages, thinking, left_out)
        if purpose == "gauge" and msg.request_id != self._gauge_request:
            return  # an older count: a newer one is on its way
        self._deliver(purpose, text, count)

    def _deliver(self, purpose: str, text: str, count: Count | None) -> None:
        if count is not None:
            self.last = count
        if purpose == "send" and count is not None and count.over and not count.alone and count.by_itself is None:
            # Over with older turns: would leaving them all out make room? If not, it must be said
            # before the send, not after the engine refuses it.
            head = tuple(m for m in count.messages[:1] if m.get("role") == "system")
            rid = self.session.count_tokens([*head, count.messages[-1]], count.thinking)
            if rid is not None:
                self._alone_checks[rid] = (text, count)
                return
        if purpose == "gauge":
            self.changed.emit(count)
        else:
            self.send_checked.emit(text, count)

    def _state_changed(self, state: str) -> None:
        if state == READY:
            self.refresh()
            return
        self.last = None
        self.changed.emit(None)
        sends = [e[1] for e in self._asked.values() if e[0] == "send"] + [t for t, _c in self._alone_checks.values()]
        self._asked.clear()
        self._alone_checks.clear()
        for text in sends:  # the engine went away: the send goes on, and fails as sends do then
            self.send_checked.emit(text, None)
