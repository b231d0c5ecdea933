"""Conversations, messages, thoughts, per-message statistics and settings in SQLite.

Why SQLite in WAL mode: every write is a small transaction that survives a crash of the app (or
of the machine, up to the last commit), and the assistant's reply is written while it streams, so
a crash loses at most the last half second of it. The schema carries a version (PRAGMA
user_version) and is brought up to date by the migrations below, one function per version.

A database that is corrupt, or that a newer FlashDesk wrote, is never overwritten or changed: it
is renamed aside with a timestamp, a fresh one is created, and `Store.notice` says what happened
so the window can tell the user.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

# Message states: a reply is "streaming" while it arrives; one that was still streaming when the
# app stopped is "interrupted" at the next start.
COMPLETE, STREAMING, CANCELLED, INTERRUPTED, FAILED = "complete", "streaming", "cancelled", "interrupted", "failed"


_V1 = [
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # AUTOINCREMENT: an id is never reused, so a late event for a deleted message cannot hit a new one
    """CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        title TEXT NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        sampling TEXT NOT NULL DEFAULT '{}'
    )""",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL DEFAULT 'complete',
        model TEXT,
        created REAL NOT NULL,
        updated REAL NOT NULL
    )""",
    "CREATE INDEX messages_by_conversation ON messages (conversation_id, id)",
    """CREATE TABLE thoughts (
        message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
        text TEXT NOT NULL,
        seconds REAL
    )""",
    """CREATE TABLE message_stats (
        message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
        data TEXT NOT NULL  -- JSON: speed, time to first token, acceptance, energy, origins
    )""",
]


# version -> the statements that bring the schema from version - 1 to it (in one transaction)
MIGRATIONS: dict[int, list[str]] = {1: _V1}


class DatabaseMovedAside(Exception):
    pass


@dataclass
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    system_prompt: str = ""
    sampling: dict = field(default_factory=dict)


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    state: str
    created: float
    updated: float
    model: str | None = None
    thought: str = ""
    thought_seconds: float | None = None
    stats: dict | None = None


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.notice: str | None = None  # set when a database was moved aside
        try:
            self.db = self._open()
        except DatabaseMovedAside as exc:
            self.notice = str(exc)
            self.db = self._open()

    # -- opening, checking, migrating --------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        fresh = not self.path.exists()
        db = sqlite3.connect(self.path, isolation_level=None)  # autocommit; explicit transactions below
        db.row_factory = sqlite3.Row
        try:
            if not fresh:
                check = db.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    raise sqlite3.DatabaseError(f"integrity check failed: {check}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            db.close()
            aside = self._move_aside("corrupt")
            raise DatabaseMovedAside(
                f"The database {self.path} could not be read ({exc}). It was moved to {aside.name}, unchanged, "
                "and a new one was started.") from exc
        if version > SCHEMA_VERSION:
            db.close()
            aside = self._move_aside(f"newer-v{version}")
            raise DatabaseMovedAside(
                f"The database {self.path} was written by a newer FlashDesk (schema version {version}; this "
                f"version knows {SCHEMA_VERSION}). It was moved to {aside.name}, unchanged, and a new one "
                "was started. Open it with the newer FlashDesk to get those conversations back.")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        self._migrate(db, version)  # a failure here is our bug, not a bad file: it is raised, nothing moved
        db.execute("UPDATE messages SET state = ? WHERE state = ?", (INTERRUPTED, STREAMING))
        return db

    @staticmethod
    def _migrate(db: sqlite3.Connection, version: int) -> None:
        for target in range(version + 1, SCHEMA_VERSION + 1):
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[target]:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {target}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def _move_aside(self, why: str) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.{why}-{stamp}")
        n = 1
        while aside.exists():
            aside = self.path.with_name(f"{self.path.name}.{why}-{stamp}-{n}")
            n += 1
        self.path.rename(aside)
        for suffix in ("-wal", "-shm"):  # the journal belongs to the moved file
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                side.rename(aside.with_name(aside.name + suffix))
        return aside

    def close(self) -> None:
        self.db.close()

    # -- settings ------------------------------------------------------------------------------------

    def setting(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return json.loads(row["value"]) if row else default

    def set_setting(self, key: str, value: Any) -> None:
        self.db.execute("INSERT INTO settings (key, value) VALUES (?, ?) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (key, json.dumps(value)))

    # -- conversations -------------------------------------------------------------------------------

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches the title, case-insensitively."""
        pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.db.execute("SELECT * FROM conversations WHERE title LIKE ? ESCAPE '\\' "
                               "ORDER BY updated DESC, id DESC", (pattern,))
        return [_conversation(r) for r in rows]

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return _conversation(row) if row else None

    def create_conversation(self, title: str = "New conversation", system_prompt: str = "",
                            sampling: dict | None = None) -> Conversation:
        now = time.time()
        cur = self.db.execute("INSERT INTO conversations (title, created, updated, system_prompt, sampling) "
                              "VALUES (?, ?, ?, ?, ?)", (title, now, now, system_prompt, json.dumps(sampling or {})))
        return self.conversation(cur.lastrowid)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def update_conversation(self, conversation_id: int, system_prompt: str, sampling: dict) -> None:
        self.db.execute("UPDATE conversations SET system_prompt = ?, sampling = ? WHERE id = ?",
                        (system_prompt, json.dumps(sampling), conversation_id))

    def touch(self, conversation_id: int) -> None:
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages ------------------------------------------------------------------------------------

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute(
            "SELECT m.*, t.text AS thought, t.seconds AS thought_seconds, s.data AS stats FROM messages m "
            "LEFT JOIN thoughts t ON t.message_id = m.id LEFT JOIN message_stats s ON s.message_id = m.id "
            "WHERE m.conversation_id = ? ORDER BY m.id", (conversation_id,))
        return [_message(r) for r in rows]

    def message(self, message_id: int) -> Message | None:
        row = self.db.execute(
            "SELECT m.*, t.text AS thought, t.seconds AS thought_seconds, s.data AS stats FROM messages m "
            "LEFT JOIN thoughts t ON t.message_id = m.id LEFT JOIN message_stats s ON s.message_id = m.id "
            "WHERE m.id = ?", (message_id,)).fetchone()
        return _message(row) if row else None

    def add_message(self, conversation_id: int, role: str, content: str = "", state: str = COMPLETE,
                    model: str | None = None) -> Message:
        now = time.time()
        self.db.execute("BEGIN")
        cur = self.db.execute("INSERT INTO messages (conversation_id, role, content, state, model, created, updated) "
                              "VALUES (?, ?, ?, ?, ?, ?, ?)", (conversation_id, role, content, state, model, now, now))
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        self.db.execute("COMMIT")
        return self.message(cur.lastrowid)

    def update_message(self, message_id: int, *, content: str | None = None, state: str | None = None,
                       thought: str | None = None, thought_seconds: float | None = None,
                       stats: dict | None = None) -> None:
        """Change what is given, in one transaction."""
        now = time.time()
        self.db.execute("BEGIN")
        try:
            if content is not None:
                self.db.execute("UPDATE messages SET content = ?, updated = ? WHERE id = ?", (content, now, message_id))
            if state is not None:
                self.db.execute("UPDATE messages SET state = ?, updated = ? WHERE id = ?", (state, now, message_id))
            if thought is not None:
                self.db.execute("INSERT INTO thoughts (message_id, text, seconds) VALUES (?, ?, ?) ON CONFLICT "
                                "(message_id) DO UPDATE SET text = excluded.text, seconds = excluded.seconds",
                                (message_id, thought, thought_seconds))
            if stats is not None:
                self.db.execute("INSERT INTO message_stats (message_id, data) VALUES (?, ?) ON CONFLICT "
                                "(message_id) DO UPDATE SET data = excluded.data", (message_id, json.dumps(stats)))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Delete this message and every later one of the conversation (regenerate, edit and resend)."""
        self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id))


def _conversation(row: sqlite3.Row) -> Conversation:
    try:
        sampling = json.loads(row["sampling"]) or {}
    except ValueError:
        sampling = {}
    return Conversation(row["id"], row["title"], row["created"], row["updated"], row["system_prompt"], sampling)


def _message(row: sqlite3.Row) -> Message:
    stats = None
    if row["stats"]:
        try:
            stats = json.loads(row["stats"])
        except ValueError:
            stats = None
    return Message(row["id"], row["conversation_id"], row["role"], row["content"], row["state"], row["created"],
                   row["updated"], row["model"], row["thought"] or "", row["thought_seconds"], stats)
