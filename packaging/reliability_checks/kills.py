"""Crash injection: SIGKILL the engine, or the app itself, in the middle of a reply, and count what
the window had shown that the database does not hold.

Engine kills run in this process, through the app's own ChatController, EngineSession and Store
on a hand-turned Qt loop: after a random number of streamed steps (or during the prefill) the
worker gets SIGKILL. Then the reply must be stored, marked interrupted, holding every token the
window had shown; the database must pass `PRAGMA integrity_check`; and a restarted engine must
answer the next message of the same conversation.

App kills run the app side as a child process (reliability_checks/child.py, the same three parts) and
SIGKILL it after a random number of shown batches. Then the database, opened as the next start
opens it, must hold the reply so far, marked interrupted (cut off), and pass the integrity check;
the orphaned engine must notice that the app is gone and exit.

Lost tokens: the tokens on screen at the kill minus those of the longest text shown that the store
holds (every text shown is a prefix of the next, so this counts exactly the tokens missing).
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .common import ANSWER_S, START_S, EventPump, integrity, replies_run_to_max_tokens

SCRIPT = Path(__file__).resolve().parents[1] / "reliability.py"
MOST_STEPS_BEFORE_KILL = 40  # an engine kill comes after 0..this many streamed steps (0: during the prefill)
MOST_BATCHES_BEFORE_KILL = 20  # an app kill comes after 1..this many shown batches
REPLY_TOKENS = 1000  # replies run to this unless killed: the kill always lands inside one
FOLLOW_UP_TOKENS = 8  # the next message's reply, after the restart
TURNS_PER_CONVERSATION = 5  # then a new conversation, so prompts stay short
DRAFT_LENGTHS = (None, 1, 3, 7, 15, "auto")
ORPHAN_EXIT_S = 30  # the engine of a killed app sees its input close and exits within this


@dataclass
class KillFigures:
    injected: int = 0
    survived: int = 0
    tokens_lost: int = 0
    failures: list[str] = field(default_factory=list)

    def record(self, number: int, problems: list[str], lost: int) -> None:
        self.injected += 1
        self.tokens_lost += lost
        if problems:
            self.failures.append(f"kill {number}: " + "; ".join(problems))
        else:
            self.survived += 1

    def as_dict(self) -> dict:
        return {
            "injected": self.injected,
            "survived": self.survived,
            "tokens_lost": self.tokens_lost,
            "failures": self.failures,
        }


def tokens_lost(shown: list[tuple[int, str]], stored: str) -> int:
    """`shown`: (tokens, text) on screen after each batch up to the kill; the tokens not in `stored`."""
    if not shown:
        return 0
    kept = max((tokens for tokens, text in shown if stored.startswith(text)), default=0)
    return shown[-1][0] - kept


# -- the engine killed --------------------------------------------------------------------------------


def engine_kills(demo: tuple[Path, Path], folder: Path, count: int, rng: random.Random, log) -> KillFigures:
    from flashdesk.app.chat.chat_controller import ChatController
    from flashdesk.app.backends.engine_session import READY, EngineSession
    from flashdesk.app.history.store import Store

    replies_run_to_max_tokens()
    pump = EventPump()
    store = Store(folder / "engine-kills.db")
    session = EngineSession(env={"FLASHDESK_WORKER_STEP_DELAY": "0.005"})
    controller = ChatController(store, session)
    figures = KillFigures()
    try:
        session.load({"target": str(demo[0]), "draft": str(demo[1]), "device": "cpu", "context": 4096})
        pump.until(lambda: session.state == READY, START_S, "the engine loads the demo pair")
        for number in range(1, count + 1):
            if (number - 1) % TURNS_PER_CONVERSATION == 0:
                controller.new_conversation()
            try:
                problems, lost = _kill_engine_once(number, pump, store, session, controller, rng)
            except TimeoutError as exc:  # said, and the next kill starts from a fresh engine
                problems, lost = [str(exc)], 0
                controller.close()
                session.restart()
                pump.until(lambda: session.state == READY, START_S, "the engine loads the demo pair again")
            figures.record(number, problems, lost)
            log(f"engine kill {number}/{count}: " + ("; ".join(problems) if problems else f"survived, {lost} lost"))
    finally:
        session.shutdown()
        store.close()
    return figures


def _kill_engine_once(number, pump, store, session, controller, rng) -> tuple[list[str], int]:
    from flashdesk.app.backends.engine_session import DEAD, READY
    from flashdesk.app.history.store import COMPLETE, INTERRUPTED

    session.set_speculation(rng.random() < 0.8, rng.choice(DRAFT_LENGTHS))
    controller.update_settings(
        "",
        {
            "temperature": rng.choice([0.0, 0.8]),
            "top_p": 1.0,
            "top_k": 0,
            "max_tokens": REPLY_TOKENS,
            "thinking": False,
        },
    )
    kill_after = rng.randint(0, MOST_STEPS_BEFORE_KILL)
    shown: list[tuple[int, str]] = []  # (tokens, text) on screen after each batch, up to the kill
    seen = {"steps": 0, "killed": False}

    def kill() -> None:
        seen["killed"] = True
        os.kill(session.pid, signal.SIGKILL)

    def on_started(msg) -> None:
        if kill_after == 0 and not seen["killed"]:
            kill()

    def on_steps(steps: list) -> None:  # connected after the controller's: the batch is on screen
        reply = controller.reply
        if reply is None or seen["killed"]:
            return
        seen["steps"] += sum(1 for step in steps if step.request_id == reply.request_id)
        shown.append((reply.tokens, reply.text))
        if seen["steps"] >= kill_after:
            kill()

    session.started.connect(on_started)
    session.steps.connect(on_steps)
    try:
        if not controller.send(f"Question {number}: tell me about lists, dictionaries and sets."):
            return [f"the message was not sent (engine {session.state})"], 0
        message_id = controller.reply.message_id
        pump.until(lambda: not controller.busy, ANSWER_S * 5, "the killed reply ends")
    finally:
        session.started.disconnect(on_started)
        session.steps.disconnect(on_steps)
    if not seen["killed"]:
        return ["the reply ended before the kill"], 0
    stored = store.message(message_id)
    problems = []
    lost = tokens_lost(shown, stored.content)
    if session.state != DEAD:
        problems.append(f"the session is {session.state}, not dead, after the kill")
    if stored.state != INTERRUPTED:
        problems.append(f"the reply is stored as {stored.state}, not interrupted")
    if shown and not stored.content.startswith(shown[-1][1]):
        problems.append(f"the store holds {len(stored.content)} characters, not the {len(shown[-1][1])} shown")
    check = integrity(store.path)
    if check != "ok":
        problems.append(f"integrity_check: {check}")

    session.restart()
    pump.until(lambda: session.state == READY, START_S, "the restarted engine loads the pair")
    controller.update_settings(
        "", {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": FOLLOW_UP_TOKENS, "thinking": False}
    )
    if not controller.send("And after that?"):
        return problems + [f"the restarted engine took no message (engine {session.state})"], lost
    pump.until(lambda: not controller.busy, ANSWER_S, "the next reply ends")
    follow_up = store.messages(controller.conversation.id)[-1]
    if follow_up.state != COMPLETE or (follow_up.stats or {}).get("tokens") != FOLLOW_UP_TOKENS:
        problems.append(
            f"the next reply after the restart is {follow_up.state} with {(follow_up.stats or {}).get('tokens')} tokens"
        )
    if store.message(message_id).content != stored.content:
        problems.append("the interrupted reply changed after the restart")
    return problems, lost


# -- the app killed ----------------------------------------------------------------------------------


def run_child(db: Path, demo: tuple[Path, Path], log_path: Path, *extra: str) -> subprocess.Popen:
    """The app side (reliability_checks/child.py) on `db`, its stderr kept in `log_path`."""
    with open(log_path, "ab") as stderr:
        return subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                "--child-app",
                str(db),
                "--target",
                str(demo[0]),
                "--draft",
                str(demo[1]),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            encoding="utf-8",
        )


class ChildEvents:
    """The child's JSON lines, read on a thread so that every wait has a deadline."""

    def __init__(self, child: subprocess.Popen):
        self.child = child
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.child.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                self.lines.put({"event": "unreadable", "text": line[:200]})
        self.lines.put(None)

    def next(self, timeout: float) -> dict | None:
        """The next event; None at the end of the child's output."""
        try:
            event = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"the app process said nothing for {timeout:.0f} s") from None
        if event is not None:
            self.seen.append(event)
        return event

    def rest(self, timeout: float) -> None:
        """Read to the end of the output (what the child wrote before it died is still in the pipe)."""
        while self.next(timeout) is not None:
            pass

    def last(self, kind: str) -> dict | None:
        return next((e for e in reversed(self.seen) if e["event"] == kind), None)


def app_kills(demo: tuple[Path, Path], folder: Path, count: int, rng: random.Random, log) -> KillFigures:
    figures = KillFigures()
    db = folder / "app-kills.db"
    for number in range(1, count + 1):
        try:
            problems, lost = _kill_app_once(number, demo, db, folder / "app-kills.log", rng)
        except TimeoutError as exc:
            problems, lost = [str(exc)], 0
        figures.record(number, problems, lost)
        log(f"app kill {number}/{count}: " + ("; ".join(problems) if problems else f"survived, {lost} lost"))
    return figures


def _kill_app_once(number: int, demo, db: Path, log_path: Path, rng: random.Random) -> tuple[list[str], int]:
    from flashdesk.app.history.store import INTERRUPTED, Store

    kill_after = rng.randint(1, MOST_BATCHES_BEFORE_KILL)
    child = run_child(
        db,
        demo,
        log_path,
        "--max-tokens",
        str(REPLY_TOKENS),
        "--prompt",
        f"Question {number}: how do I read a file line by line?",
    )
    events = ChildEvents(child)
    batches, worker = 0, None
    try:
        while batches < kill_after:
            event = events.next(START_S)
            if event is None:
                return [f"the app process ended before the kill (exit code {child.wait()}; see {log_path})"], 0
            if event["event"] == "ready":
                worker = event["worker"]
            batches += event["event"] == "shown"
        child.send_signal(signal.SIGKILL)
        events.rest(ANSWER_S)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()
    problems = []
    if events.last("ended") is not None:
        problems.append("the reply ended before the kill")
    if worker is not None and not _exits(worker, ORPHAN_EXIT_S):
        problems.append(f"the engine process {worker} outlived the app by {ORPHAN_EXIT_S} s")
        os.kill(worker, signal.SIGKILL)
    shown = [(e["tokens"], e["text"]) for e in events.seen if e["event"] == "shown"]
    reply = events.last("reply")
    store = Store(db)  # as the next start opens it
    try:
        stored = store.message(reply["message"]) if reply else None
        if store.notice:
            problems.append(f"the next start says: {store.notice}")
        if stored is None:
            return problems + ["the reply is not in the database"], shown[-1][0] if shown else 0
        lost = tokens_lost(shown, stored.content)
        if stored.state != INTERRUPTED:
            problems.append(f"the reply is stored as {stored.state}, not interrupted (cut off)")
        if shown and not stored.content.startswith(shown[-1][1]):
            problems.append(f"the store holds {len(stored.content)} characters, not the {len(shown[-1][1])} shown")
    finally:
        store.close()
    check = integrity(db)
    if check != "ok":
        problems.append(f"integrity_check: {check}")
    return problems, lost


def _exits(pid: int, timeout: float) -> bool:
    """Whether process `pid` (not our child: the killed app's) is gone, or a zombie, within `timeout`."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False
