"""The chat's logic: send, stream, stop, regenerate, edit and resend, and keep it all in the store.

Why apart from the window: this is the part that must be right when things go wrong (the engine
dies mid-reply, the user stops, an error comes back) and it is easier to see that when no widget
code is mixed in. The reply is written to the store as each batch of steps arrives, before the
window shows it (one UPDATE a batch: the engines batch steps to 30 a second at most, which WAL mode
takes easily), and once more when it ends or the engine dies, so a kill of the app or of the engine
loses none of the text the user saw. A write that fails (a full disk) is said once per reply
(`notice`) and the reply goes on.

The context: each turn is sent with the conversation's policy for a conversation that outgrew it
(drop the oldest turns, or stop), and the engine reuses the prompt prefix it already holds from the
earlier turns. A turn the engine refuses before it starts (bad input: a conversation past the
context under "stop") is taken back: the user's message leaves the conversation and its text is
handed back (`turn_refused`) for the message box, so nothing is lost. A reply that filled the
context can go on with the oldest turns dropped (`continue_after_context`), or the user starts a
new conversation carrying the system prompt and settings (`new_conversation_like`).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Callable

from PySide6.QtCore import QObject, Signal

from flashdesk import protocol as p
from flashdesk.app.backends.engine_session import EngineSession
from flashdesk.app.chat.reply import Reply, origins_up_to
from flashdesk.app.chat.settings_dialog import DEFAULT_SAMPLING, DROP_OLDEST, sampling_with_defaults
from flashdesk.app.history.store import CANCELLED, COMPLETE, FAILED, INTERRUPTED, STREAMING, Conversation, Store
from flashdesk.app.history.titles import title_from

NEW_TITLE = "New conversation"
CONTINUE_TEXT = "Continue."  # the follow-up that asks a reply cut off by the full context to go on


class ChatController(QObject):
    conversation_changed = Signal(object)  # Conversation (or None)
    conversations_changed = Signal()
    reply_started = Signal(object)  # the new assistant Message
    reply_progress = Signal(object)  # Reply
    reply_ended = Signal(object)  # the stored assistant Message
    messages_removed = Signal(int)  # this message id and later ones left the conversation
    messages_replaced = Signal()  # the conversation's messages changed in place (another version or branch shown)
    message_added = Signal(object)  # a user Message
    busy_changed = Signal(bool)
    notice = Signal(str)
    turn_refused = Signal(str, str)  # the user's text given back ("" when none), the engine's reason
    edit_refused = Signal(int, str, str)  # the message edited, the edit's text given back, the reason

    def __init__(
        self,
        store: Store,
        session: EngineSession,
        energy_mj: Callable[[], int | None] = lambda: None,
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.store = store
        self.session = session
        self.energy_mj = energy_mj
        self.conversation: Conversation | None = None
        self.reply: Reply | None = None
        self.reuse = True  # Generate.reuse: off only to measure what the prefix reuse saves
        self.new_sampling: dict = {}  # what a new conversation starts with (Settings); later ones keep theirs
        self._unsaved_said = False  # a failed write of this reply was told (once a reply)
        session.started.connect(self._started)
        session.steps.connect(self._steps)
        session.finished.connect(self._finished)
        session.error.connect(self._error)
        session.died.connect(self._died)

    @property
    def busy(self) -> bool:
        return self.reply is not None

    # -- conversations --------------------------------------------------------------------------------

    def open(self, conversation_id: int | None) -> None:
        self.conversation = self.store.conversation(conversation_id) if conversation_id is not None else None
        self.conversation_changed.emit(self.conversation)

    def new_conversation(self) -> Conversation:
        conv = self.store.create_conversation(NEW_TITLE, "", dict(self.new_sampling) or None)
        self.conversations_changed.emit()
        self.open(conv.id)
        return conv

    def new_conversation_like(self) -> Conversation:
        """A new conversation with the open one's system prompt and settings."""
        old = self.conversation
        conv = self.store.create_conversation(
            NEW_TITLE, old.system_prompt if old else "", old.sampling if old else None
        )
        self.conversations_changed.emit()
        self.open(conv.id)
        return conv

    def rename(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title)
        if self.conversation and self.conversation.id == conversation_id:
            self.conversation.title = title
            self.conversation_changed.emit(self.conversation)
        self.conversations_changed.emit()

    def delete(self, conversation_id: int) -> None:
        if self.busy and self.conversation and self.conversation.id == conversation_id:
            self.stop()
            self._end(CANCELLED)
        self.store.delete_conversation(conversation_id)
        if self.conversation and self.conversation.id == conversation_id:
            rest = self.store.conversations()
            self.open(rest[0].id if rest else None)
        self.conversations_changed.emit()

    def update_settings(self, system_prompt: str, sampling: dict) -> None:
        """Keep the conversation's settings. A reply length left at the default for this context is
        not kept as the conversation's own: loaded with a longer context, its default grows too."""
        if self.conversation:
            sampling = dict(sampling)
            own = (self.conversation.sampling or {}).get("max_tokens")
            if own is None and sampling.get("max_tokens") == self.sampling()["max_tokens"]:
                del sampling["max_tokens"]
            self.store.update_conversation(self.conversation.id, system_prompt, sampling)
            self.conversation = self.store.conversation(self.conversation.id)
            self.conversation_changed.emit(self.conversation)

    def sampling(self) -> dict:
        """The conversation's settings, its gaps filled from the model's and ours. The default reply
        length is at most a quarter of the loaded context: a longer default fills a small context in
        two turns, and then the reply that runs into its end has nothing left to go on with."""
        info = self.session.info
        defaults = dict(info.sampling_defaults or {}) if info else {}
        if info is not None and info.context_limit:
            longest = min(defaults.get("max_tokens", DEFAULT_SAMPLING["max_tokens"]), info.context_limit // 4)
            defaults["max_tokens"] = max(1, longest)
        return sampling_with_defaults(self.conversation.sampling if self.conversation else None, defaults)

    # -- sending --------------------------------------------------------------------------------------

    def send(self, text: str, policy: str | None = None) -> bool:
        """Add `text` as the user's message and ask for the reply; `policy` overrides the
        conversation's context policy for this turn."""
        if self.busy or self.session.state != "ready":
            return False
        if self.conversation is None:
            self.new_conversation()
        conv = self.conversation
        title = title_from(text)
        if conv.title == NEW_TITLE and title:  # a message without words leaves the title to the next one
            self.rename(conv.id, title)
        user = None
        try:
            user = self.store.add_message(conv.id, "user", text)
            self.message_added.emit(user)
            self.conversations_changed.emit()
            return self._generate(policy, user)
        except sqlite3.Error as exc:  # a full or failing disk: nothing is sent, the text goes back
            self._turn_not_saved(exc, user)
            return False

    def _turn_not_saved(self, exc: sqlite3.Error, user=None) -> None:
        """A turn whose messages could not be written: nothing goes to the engine; the user message
        written before the failure is taken back where the disk still allows it."""
        if user is not None:
            try:
                self.store.delete_messages_from(user.conversation_id, user.id)
                self.messages_removed.emit(user.id)
            except sqlite3.Error:
                pass  # it stays, as saved; the text is also back in the box
        self.notice.emit(
            f"Not sent: the conversation could not be saved ({exc}). Free some disk space and send "
            "again; what was saved before is safe."
        )

    def continue_after_context(self) -> bool:
        """After a reply that filled the context: the engine goes on writing it, in the same message,
        with the oldest turns (and, for a long reply, its own start) left out of the prompt to make
        room. A server is asked the same way (vLLM's continue_final_message, which SGLang, llama.cpp
        and FlashDesk's own server take too); one that refuses it gets a follow-up message instead."""
        if self.busy or self.conversation is None or self.session.state != "ready":
            return False
        shown = self.store.messages(self.conversation.id)
        last = shown[-1] if shown else None
        if last is None or last.role != "assistant" or not last.content.strip():
            return self.send(CONTINUE_TEXT, DROP_OLDEST)
        try:
            return self._generate(DROP_OLDEST, continuing=last)
        except sqlite3.Error as exc:
            self._turn_not_saved(exc)
            return False

    def regenerate(self, message_id: int) -> bool:
        """Write the reply `message_id` again: a new version of it, shown now. The earlier versions
        stay, each with the messages that followed it, to browse back to with ‹ ›."""
        if self.busy or self.conversation is None or self.session.state != "ready":
            return False
        self.messages_removed.emit(message_id)
        try:
            return self._generate(version_of=message_id)
        except sqlite3.Error as exc:
            self.messages_replaced.emit()  # the version shown before, shown again
            self._turn_not_saved(exc)
            return False

    def show_version(self, message_id: int, step: int) -> bool:
        """Show the version before (-1) or after (+1) the message `message_id` (a reply or an edited
        message) and the branch that follows it; it is what the next turn sees, and it stays chosen."""
        if self.busy or self.conversation is None:
            return False
        ids = [m.id for m in self.store.versions(message_id)]
        index = ids.index(message_id) + step if message_id in ids else -1
        if not 0 <= index < len(ids):
            return False
        self.store.choose_version(ids[index])
        self.messages_replaced.emit()
        return True

    def show_branch_of(self, message_id: int) -> bool:
        """Show the branch the message `message_id` of the open conversation lies in (a search hit);
        not while this conversation writes a reply (its branch must stay the one shown)."""
        message = self.store.message(message_id)
        if self.conversation is None or message is None or message.conversation_id != self.conversation.id:
            return False
        if self._writing_here():
            return False
        self.store.choose_branch(message_id)
        self.messages_replaced.emit()
        return True

    def _writing_here(self) -> bool:
        """A reply of the open conversation is being written."""
        streaming = self.store.message(self.reply.message_id) if self.reply is not None else None
        return streaming is not None and streaming.conversation_id == self.conversation.id

    def resend(self, message_id: int, text: str) -> bool:
        """Send `text` as a new version of the user message `message_id` and reply to it. The earlier
        version stays, with what followed it, to browse back to with ‹ ›."""
        if self.busy or self.conversation is None or self.session.state != "ready":
            return False
        self.messages_removed.emit(message_id)
        user = None
        try:
            user = self.store.add_message(self.conversation.id, "user", text, version_of=message_id)
            self.message_added.emit(user)
            if not self._generate(user=user):
                return False
        except sqlite3.Error as exc:
            self._turn_not_saved(exc, user)
            self.messages_replaced.emit()  # the version edited, shown again
            return False
        self.reply.edited = message_id
        return True

    def _history(self, before: int | None = None) -> list[dict]:
        """The branch shown as the engine's messages; with `before`, only what precedes that message."""
        conv = self.conversation
        if conv is None:
            return []
        messages = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        for m in self.store.messages(conv.id):
            if m.id == before:
                break
            if m.role in ("user", "assistant") and m.content.strip():
                messages.append({"role": m.role, "content": m.content})
        return messages

    def prompt_messages(self, text: str = "") -> list[dict]:
        """The messages a send of `text` would give the engine (for the context gauge)."""
        messages = self._history()
        if text.strip():
            messages.append({"role": "user", "content": text.strip()})
        return messages

    def _generate(self, policy: str | None = None, user=None, version_of: int | None = None, continuing=None) -> bool:
        """Ask for a reply to the conversation as shown; `continuing`: its last message, a reply the
        context cut off, which the engine writes on (the history ends with it, trimmed as the chat
        template trims it); `version_of`: a reply written again, as a new version of it."""
        history = self._history(before=version_of)
        if continuing is not None:
            before = continuing.content.rstrip()
            history[-1] = {"role": "assistant", "content": before}
        if not history or history[-1]["role"] != ("assistant" if continuing is not None else "user"):
            return False
        s = self.sampling()
        info = self.session.info
        if continuing is not None:
            message = continuing
            self.store.update_message(message.id, content=before, state=STREAMING)
        else:
            message = self.store.add_message(
                self.conversation.id,
                "assistant",
                "",
                STREAMING,
                model=info.name if info else None,
                version_of=version_of,
            )
        rid = uuid.uuid4().hex[:12]
        energy = self.energy_mj() if info and info.device.startswith("cuda") else None
        self.reply = Reply(
            rid,
            message.id,
            time.monotonic(),
            energy,
            requested_max_tokens=int(s["max_tokens"]),
            user_message_id=user.id if user else None,
            user_text=user.content if user else "",
        )
        if continuing is not None:
            self.reply.before = before
            self.reply.thought_before = continuing.thought or ""
            self.reply.thought_seconds_before = continuing.thought_seconds
            self.reply.stats_before = dict(continuing.stats or {})
            self.reply.origins = origins_up_to((continuing.stats or {}).get("origins"), len(before))
        request = p.Generate(
            rid,
            history,
            float(s["temperature"]),
            float(s["top_p"]),
            int(s["top_k"]),
            None,
            int(s["max_tokens"]),
            bool(s["thinking"]) and continuing is None,  # a reply is continued past its thinking
            context_policy=policy or s.get("context_policy") or DROP_OLDEST,
            reuse=self.reuse,
        )
        self._unsaved_said = False
        self.reply_started.emit(message)
        self.busy_changed.emit(True)
        if not self.session.generate(request):
            self._end(FAILED, "the engine is not ready")
            return False
        return True

    def stop(self) -> None:
        if self.reply is not None:
            self.session.cancel(self.reply.request_id)

    # -- engine events ---------------------------------------------------------------------------------

    def _mine(self, request_id: str | None) -> bool:
        return self.reply is not None and request_id == self.reply.request_id

    def _started(self, msg: p.Started) -> None:
        if self._mine(msg.request_id):
            self.reply.start(msg)
            self.reply_progress.emit(self.reply)  # the window says now if older messages were left out

    def _steps(self, steps: list) -> None:
        if self.reply is None:
            return
        mine = [s for s in steps if s.request_id == self.reply.request_id]
        if mine:
            self.reply.add_steps(mine)
            self.save_reply()  # before it is shown: what the window shows is in the store
            self.reply_progress.emit(self.reply)

    def _finished(self, msg: p.Finished) -> None:
        if not self._mine(msg.request_id):
            return
        info = self.session.info
        self.reply.finish(msg, self.energy_mj() if info and info.device.startswith("cuda") else None)
        self._end(CANCELLED if msg.reason == "cancelled" else COMPLETE)

    def _error(self, msg: p.Error) -> None:
        if self._mine(msg.request_id) or (self.reply is not None and msg.during == "generate"):
            if msg.kind == p.BAD_INPUT and not self.reply.started:
                self._refused(msg.message)
            else:
                self._end(FAILED, msg.message)

    def _refused(self, reason: str) -> None:
        """The engine refused the turn before it began: take it back, and give the user's text back."""
        r = self.reply
        self.reply = None
        message = self.store.message(r.message_id)
        if message is not None and r.before:  # a reply to go on with stays as it was
            self._write(lambda: self.store.update_message(r.message_id, state=COMPLETE))
            self.reply_ended.emit(self.store.message(r.message_id) or message)
            if getattr(self.session, "is_remote", False):
                self.busy_changed.emit(False)  # a server that cannot go on with a reply: asked to, in words
                self.send(CONTINUE_TEXT, DROP_OLDEST)
                return
        elif message is not None:
            first = r.user_message_id or r.message_id
            versions = (self.store.message(first) or message).versions
            self.store.delete_messages_from(message.conversation_id, first)
            conv = self.store.conversation(message.conversation_id)
            emptied = not any(m.role != "system" for m in self.store.messages(message.conversation_id))
            if emptied and conv is not None and conv.title == title_from(r.user_text or ""):
                self.rename(message.conversation_id, NEW_TITLE)  # not named after what was not sent
            if self.conversation and self.conversation.id == message.conversation_id:
                self.messages_removed.emit(first)
                if versions > 1:  # a refused regenerate or edit: the version before shows again, with its branch
                    self.messages_replaced.emit()
        self.busy_changed.emit(False)
        self.conversations_changed.emit()
        if r.edited is not None:  # an edit: its text goes back into the editor it came from
            self.edit_refused.emit(r.edited, r.user_text, reason)
        else:
            self.turn_refused.emit(r.user_text, reason)

    def _died(self, reason: str) -> None:
        if self.reply is not None:
            self._end(INTERRUPTED, reason)

    def save_reply(self) -> None:
        """Write the reply as it stands (each batch of steps, before the window shows it)."""
        r = self.reply
        if r is None:
            return
        if self._write(
            lambda: self.store.update_message(
                r.message_id,
                content=r.text,
                thought=r.thought_text if r.thought else None,
                thought_seconds=r.thought_seconds,
            )
        ):
            r.saved_at = time.monotonic()

    def _write(self, write: Callable[[], None]) -> bool:
        """Run a write of the reply; a failure (a full disk) is said once a reply, and the reply goes on."""
        try:
            write()
            return True
        except sqlite3.Error as exc:
            if not self._unsaved_said:
                self._unsaved_said = True
                self.notice.emit(
                    f"The reply could not be saved ({exc}): the window shows it, but it is not kept. "
                    "Free some disk space; what was saved before is safe."
                )
            return False

    def close(self) -> None:
        """The window is closing: keep the reply as it stands, marked stopped."""
        if self.reply is not None:
            self.stop()
            self._end(CANCELLED)

    def _end(self, state: str, error: str | None = None) -> None:
        r = self.reply
        if r is None:
            return
        stats = r.stats()
        if error:
            stats["error"] = error
        if r.before and not r.tokens:  # a continuation that wrote nothing: the reply stays as it was,
            state, stats = COMPLETE, r.stats_before  # Continue still offered (an error says itself elsewhere)
        saved = self._write(
            lambda: self.store.update_message(
                r.message_id,
                content=r.text,
                state=state,
                thought=r.thought_text if r.thought else None,
                thought_seconds=r.thought_seconds,
                stats=stats,
            )
        )
        self.reply = None
        message = self.store.message(r.message_id)
        if message is not None:
            if saved:
                self._write(lambda: self.store.touch(message.conversation_id))
            else:  # the window shows the reply as it ended, though the store could not take it
                message.content, message.state = r.text, state
            self.reply_ended.emit(message)
        self.busy_changed.emit(False)
        self.conversations_changed.emit()
