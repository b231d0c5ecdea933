"""The window's side of the context: the check before a send, the warnings and refusals in the
context banner, Trim it to fit, Continue the reply, and the gauge under the message box.

Why apart: what a send past the context does is the engine's rule (engine/decode/conversation.py)
and the gauge's count (context_gauge.py); this is only what the window shows and offers about it,
so no message is lost and no button leads into a refusal. A base class of the main window, which
owns the widgets it reads (composer, banners, controller, gauge).
"""

from __future__ import annotations

from PySide6.QtGui import QTextCursor

from flashdesk.app.chat.context_gauge import refused_text, trimmed_to_fit
from flashdesk.app.chat.settings_dialog import DROP_OLDEST, STOP

SEND_ANYWAY, CANCEL = "Send anyway", "Cancel"
DROP_AND_SEND, CONTINUE_REPLY = "Drop oldest turns and send", "Continue the reply"
TRIM = "Trim it to fit"
NEW_LIKE = "New conversation with the same system prompt"


class ContextFlow:
    def send(self, text: str) -> None:
        """The message box sent `text`: count it with the conversation first (a few milliseconds, the
        engine's tokenizer), and warn before a send past the context."""
        self.context_banner.hide()
        self.gauge.check_send(text)

    def _dropping_already(self, count) -> bool:
        """Whether the engine already leaves this conversation's oldest turns out (its last reply
        says so) and may go on doing so: warned once, a send is not asked about again."""
        return not count.alone and self._left_out() > 0

    def _left_out(self) -> int:
        """The oldest messages the engine leaves out of this conversation's prompt now: as many as
        its last reply's prompt left out, under the drop-oldest policy (0 under stop)."""
        if self.controller.sampling().get("context_policy") == STOP or not self.controller.conversation:
            return 0
        replies = [m for m in self.store.messages(self.controller.conversation.id) if m.role == "assistant"]
        return int((replies[-1].stats or {}).get("dropped_messages") or 0) if replies else 0

    def _composer_edited(self) -> None:
        """A send's warning is about the text in the box: emptied, the warning goes (only while it is
        that warning the banner shows)."""
        if not self.context_banner.isVisible():
            self._send_warning = False
        if getattr(self, "_send_warning", False) and not self.composer.edit.toPlainText().strip():
            self._send_warning = False
            self.context_banner.hide()

    def _send_checked(self, text: str, count) -> None:
        if count is None or not count.over or self._dropping_already(count):
            self._send_now(text)
            return
        self.composer.edit.setPlainText(text)
        policy = self.controller.sampling().get("context_policy")
        self._send_warning = True  # clearing the message box takes it away
        if count.alone:  # nothing can be dropped: only a shorter message (or a shorter reply) fits
            self.context_banner.show_choice(
                count.warning(policy), (TRIM, lambda: self._trim_to_fit(count)), (CANCEL, self._cancel_send), "error"
            )
        elif policy == STOP:
            self.context_banner.show_choice(
                count.warning(STOP), (DROP_AND_SEND, self._send_dropping), (NEW_LIKE, self._new_like), "error"
            )
        else:
            self.context_banner.show_choice(
                count.warning(DROP_OLDEST),
                (SEND_ANYWAY, self._send_anyway),
                (CANCEL, self.context_banner.hide),
                "error",
            )

    def _trim_to_fit(self, count) -> None:
        """A message too long for the context by itself: keep its start, what fits, in the message
        box to read over and send (the gauge counts it again; a second trim takes a little more)."""
        text = self.composer.edit.toPlainText()
        kept = trimmed_to_fit(text, count)
        self.context_banner.hide()
        cursor = self.composer.edit.textCursor()  # one edit the box can undo (setPlainText clears the undo)
        cursor.beginEditBlock()
        cursor.select(QTextCursor.SelectionType.Document)
        cursor.insertText(kept)
        cursor.endEditBlock()
        self.composer.edit.setTextCursor(cursor)
        self.composer.edit.setFocus()
        self.statusBar().showMessage(
            f"Trimmed to its first {len(kept):,} of {len(text):,} characters, to fit the context; "
            "Enter sends it (Ctrl+Z in the message box brings the rest back)",
            15_000,
        )

    def _cancel_send(self) -> None:
        self.context_banner.hide()

    def _send_now(self, text: str, policy: str | None = None) -> None:
        if not self.controller.send(text, policy):
            self.composer.edit.setPlainText(text)

    def _composer_text(self) -> str:
        text = self.composer.edit.toPlainText().strip()
        self.composer.edit.clear()
        return text

    def _send_anyway(self) -> None:
        """Past the context, as the conversation's policy says (the oldest turns dropped)."""
        self.context_banner.hide()
        if text := self._composer_text():
            self._send_now(text)

    def _send_dropping(self) -> None:
        """Past the context with the oldest turns dropped, whatever the conversation's policy."""
        self.context_banner.hide()
        if text := self._composer_text():
            self._send_now(text, DROP_OLDEST)

    def _new_like(self) -> None:
        """A new conversation with this one's system prompt and settings; the message box keeps its text."""
        self.context_banner.hide()
        self.controller.new_conversation_like()
        self.show_chat()

    def _continue(self) -> None:
        self.context_banner.hide()
        self.controller.continue_after_context()

    def _turn_refused(self, text: str, reason: str) -> None:
        """The engine refused the turn (a conversation past the context under "stop"): nothing is lost."""
        if text:
            self.composer.edit.setPlainText(text)
        self._send_warning = bool(text)  # about the text put back: emptying the box takes it away
        if "last message alone" in reason:  # no turn to drop, no conversation to start: only a shorter one
            count = self.gauge.last
            if text and count is not None and count.messages and count.messages[-1].get("content") == text.strip():
                trim = (TRIM, lambda: self._trim_to_fit(count))
                self.context_banner.show_choice(refused_text(reason, True), trim, (CANCEL, self._cancel_send), "error")
            else:
                self.context_banner.show_text(refused_text(reason, bool(text)), None, "error")
                self.context_banner.close_button.setVisible(True)
            return
        other = (DROP_AND_SEND, self._send_dropping) if text else (CANCEL, self.context_banner.hide)
        self.context_banner.show_choice(refused_text(reason, bool(text)), (NEW_LIKE, self._new_like), other, "error")

    def _edit_refused(self, message_id: int, text: str, reason: str) -> None:
        """An edit the engine refused: the earlier version shows again, and the edit goes back into
        its editor (the message box, and any draft in it, is left alone)."""
        widget = self.chat.widget(message_id)
        if widget is None:
            self._turn_refused(text, reason)
            return
        widget.start_edit()
        widget.editor.setPlainText(text)
        self._send_warning = False
        self.context_banner.show_text(refused_text(reason, False) + " Your edit is back in its editor.", None, "error")
        self.context_banner.close_button.setVisible(True)

    def _show_gauge(self, count) -> None:
        if count is None:
            self.composer.set_gauge(None)
            return
        policy = self.controller.sampling().get("context_policy")
        self.composer.set_gauge(count.text(), count.level, count.tooltip(policy))
