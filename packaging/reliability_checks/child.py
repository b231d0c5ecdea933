"""The app side as a process of its own, for packaging/reliability.py to kill or to starve of disk.

    python packaging/reliability.py --child-app DB --target DIR --draft DIR [--disk-room BYTES --disk-limit HOW]

It is the app without its window: the real Store on DB, EngineSession (which starts the real
worker) and ChatController, on a QCoreApplication whose loop is turned by hand. It loads the pair,
opens the newest conversation of DB (as the window does at start; a new one when there is none),
sends one message and streams the reply. On stdout it writes one JSON line per thing the window
would show: `ready` (the worker's pid), `reply` (the stored message's id), `shown` after every
batch of steps (the tokens and text on screen at that moment), `notice` (a message for the
user), `ended` (the stored reply's state). The parent kills it at a random `shown`, or, with
--disk-room, leaves it that many bytes of disk before the reply (a full disk while saving).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
from pathlib import Path

from .common import ANSWER_S, START_S, EventPump, replies_run_to_max_tokens

STEP_DELAY_S = "0.01"  # the worker sleeps this after every step: a reply streams for a few seconds
FILLER = "filler.bin"  # the file that takes the disk's room (tmpfs)
TMPFS, RLIMIT = "tmpfs", "rlimit"  # how the disk is made full: a small tmpfs filled up, or RLIMIT_FSIZE


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="reliability.py --child-app")
    parser.add_argument("db", type=Path)
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument("--prompt", default="Tell me about the standard library.")
    parser.add_argument("--disk-room", type=int, help="bytes of disk left to the database when the reply starts")
    parser.add_argument("--disk-limit", choices=(TMPFS, RLIMIT), default=TMPFS)
    return parser.parse_args(argv)


def say(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}, ensure_ascii=False), flush=True)


def leave_room(db: Path, room: int, how: str) -> None:
    """Make the disk under `db` full but for `room` bytes: fill the (small, tmpfs) folder with a
    file, or cap the size any file of this process may grow to (writes past it fail with EFBIG)."""
    if how == TMPFS:
        stat = os.statvfs(db.parent)
        free = stat.f_bavail * stat.f_frsize
        with open(db.parent / FILLER, "wb") as filler:
            filler.truncate(0)
            chunk = b"\0" * (1 << 16)
            for _ in range(max(0, free - room) // len(chunk)):
                filler.write(chunk)
        return
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing us
    largest = max(path.stat().st_size for path in db.parent.iterdir() if path.is_file())
    resource.setrlimit(resource.RLIMIT_FSIZE, (largest + room, largest + room))


def main(argv: list[str]) -> int:
    args = parse(argv)
    from flashdesk.app.chat.chat_controller import ChatController
    from flashdesk.app.backends.engine_session import READY, EngineSession
    from flashdesk.app.history.store import Store

    replies_run_to_max_tokens()
    pump = EventPump()
    store = Store(args.db)
    session = EngineSession(env={"FLASHDESK_WORKER_STEP_DELAY": STEP_DELAY_S})
    controller = ChatController(store, session)
    try:
        session.load({"target": args.target, "draft": args.draft, "device": "cpu", "context": 4096})
        pump.until(lambda: session.state == READY, START_S, "the engine loads the demo pair")
        say("ready", worker=session.pid, notice=store.notice)
        newest = store.conversations()
        controller.open(newest[0].id) if newest else controller.new_conversation()
        controller.update_settings(
            "", {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": args.max_tokens, "thinking": False}
        )
        controller.reply_started.connect(lambda message: say("reply", message=message.id))
        controller.reply_progress.connect(lambda reply: say("shown", tokens=reply.tokens, text=reply.text))
        controller.notice.connect(lambda text: say("notice", text=text))
        controller.reply_ended.connect(lambda message: say("ended", message=message.id, state=message.state))
        if args.disk_room is not None:
            leave_room(args.db, args.disk_room, args.disk_limit)
        if not controller.send(args.prompt):
            say("refused")
            return 1
        pump.until(lambda: not controller.busy, ANSWER_S * 5, "the reply ends")
        return 0
    finally:
        session.shutdown()
        store.close()
