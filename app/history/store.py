"""Conversations, messages, thoughts, per-message statistics and settings in SQLite.

Why SQLite in WAL mode: every write is a small transaction that survives a crash of the app (or
of the machine, up to the last commit), and the assistant's reply is written as the window shows
it (app/chat/chat_controller.py saves each batch of steps before showing it), so a crash of the app or
of the engine loses none of the text the window showed. The schema carries a version (PRAGMA
user_version) and is brought up to date by the migrations below, one function per version.

A database that is corrupt, or that a newer FlashDesk wrote, is never overwritten or changed: it
is renamed aside with a timestamp, a fresh one is created, and `Store.notice` says what happened
so the window can tell the user. One that is fine but cannot be used now (locked by another
program, read-only, on a full or failing disk) is left exactly where and as it is:
`DatabaseUnavailable` says why. A write that fails (a full disk) raises SQLite's own error after
the transaction is undone, and the rows committed before it stay as they were.

Search: an FTS5 index over message text and titles (schema version 2), kept in step by triggers
(the reply as it streams included), so a search does not read every message. Where Python's sqlite3
was built without FTS5, version 2 adds no index and search falls back to LIKE over titles and
messages (a scan, the query matched as one piece of text).

Branches (schema version 4): a conversation is a tree, so nothing is lost when the user goes back.
Each message names the one it follows (`parent_id`, NULL for a first message). The messages that
follow the same one are the versions of that turn (a regenerated reply, an edited message), oldest
first, and exactly one of them is chosen (`hidden = 0`). The conversation shown, exported and given
to the engine is the branch found by following the chosen message down from the first. Search
reads every branch.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

SCHEMA_VERSION = 4

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


def _search_index(table: str, column: str, source: str, trigger: str) -> list[str]:
    """An FTS5 index of `source`.`column` that reads the text from `source` (stored once), its
    triggers, and the indexing of the rows already there."""
    new = f"INSERT INTO {table} (rowid, {column}) VALUES (new.id, new.{column});"
    old = f"INSERT INTO {table} ({table}, rowid, {column}) VALUES ('delete', old.id, old.{column});"
    return [
        f"CREATE VIRTUAL TABLE {table} USING fts5({column}, content='{source}', content_rowid='id')",
        f"CREATE TRIGGER {trigger}_insert AFTER INSERT ON {source} BEGIN {new} END",
        f"CREATE TRIGGER {trigger}_delete AFTER DELETE ON {source} BEGIN {old} END",
        f"CREATE TRIGGER {trigger}_update AFTER UPDATE OF {column} ON {source} BEGIN {old} {new} END",
        f"INSERT INTO {table} ({table}) VALUES ('rebuild')",
    ]


def _has_fts5() -> bool:
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE VIRTUAL TABLE probe USING fts5(text)")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


_V2 = (
    (
        _search_index("message_search", "content", "messages", "messages_search")
        + _search_index("title_search", "title", "conversations", "conversations_search")
    )
    if _has_fts5()
    else []
)

# Reply versions as schema version 3 kept them: every version of a reply a row of one `slot` (the id
# of the first version), the one shown not `hidden`. Version 4 (branches, below) reads `hidden` still;
# `slot` only to migrate.
_V3 = [
    "ALTER TABLE messages ADD COLUMN slot INTEGER",
    "ALTER TABLE messages ADD COLUMN hidden INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX messages_by_slot ON messages (slot)",
]

# Branches (see the module's docstring). In version 3 a conversation is a line of places, each a
# message or the versions of one reply (its `slot`, the first version's id, ordered like the ids).
# Every message follows the message shown at the place before its own (the version not hidden, else
# the newest), so the conversation shown stays as it was and the hidden versions of a reply become
# its siblings. A group of siblings left with no version shown (none should be) shows its newest.
# Window functions over a temporary table: one pass, not a search per message. `slot` is read no more.
_V4 = [
    "ALTER TABLE messages ADD COLUMN parent_id INTEGER",
    """CREATE TEMP TABLE v3_places AS
        SELECT conversation_id, place, LAG(shown) OVER (PARTITION BY conversation_id ORDER BY place) AS before
        FROM (SELECT conversation_id, COALESCE(slot, id) AS place, id AS shown, ROW_NUMBER() OVER (
                PARTITION BY conversation_id, COALESCE(slot, id) ORDER BY hidden, id DESC) AS rank
              FROM messages)
        WHERE rank = 1""",
    "CREATE UNIQUE INDEX temp.v3_places_by_place ON v3_places (conversation_id, place)",
    "UPDATE messages SET parent_id = (SELECT before FROM v3_places "
    "WHERE conversation_id = messages.conversation_id AND place = COALESCE(messages.slot, messages.id))",
    "DROP TABLE v3_places",
    "UPDATE messages SET hidden = 0 WHERE id IN (SELECT MAX(id) FROM messages "
    "GROUP BY conversation_id, parent_id HAVING SUM(hidden = 0) = 0)",
    "CREATE INDEX messages_by_parent ON messages (conversation_id, parent_id)",
    # the conversations that have branches: search looks for a hit in the branch shown only there
    "CREATE INDEX messages_set_aside ON messages (conversation_id) WHERE hidden = 1",
]

# version -> the statements that bring the schema from version - 1 to it (in one transaction)
MIGRATIONS: dict[int, list[str]] = {1: _V1, 2: _V2, 3: _V3, 4: _V4}

HIT_START, HIT_END = "\x02", "\x03"  # around each hit in SearchHit.snippet
SNIPPET_TOKENS = 12
SNIPPET_CHARS = 36  # on each side of the hit, in the LIKE fallback


class DatabaseMovedAside(Exception):
    pass


class DatabaseUnavailable(Exception):
    """The database cannot be opened now, though nothing says it is damaged; it was not touched."""


# what keeps a sound database from opening: (SQLite's error names, phrases of its messages, what to tell the user)
_UNUSABLE = [
    (
        ("SQLITE_BUSY", "SQLITE_LOCKED"),
        ("database is locked", "database table is locked"),
        "is locked by another program (is FlashDesk already running?). Close that program and start FlashDesk again",
    ),
    (
        ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM"),
        ("readonly database", "unable to open"),
        "is read-only, or in a folder FlashDesk cannot write to. Make both writable and start FlashDesk again",
    ),
    (("SQLITE_FULL",), ("disk is full",), "is on a full disk. Free some space and start FlashDesk again"),
    (("SQLITE_IOERR",), ("disk i/o error",), "could not be read or written (a disk error)"),
]


def _unusable(path: Path, exc: sqlite3.Error) -> DatabaseUnavailable | None:
    """The error to raise when `exc` says the database at `path` cannot be used now (locked,
    read-only, a full or failing disk) rather than that it is damaged; None otherwise."""
    name = getattr(exc, "sqlite_errorname", "") or ""  # Python 3.11+
    text = str(exc).lower()
    for names, phrases, why in _UNUSABLE:
        if name.startswith(names) or any(phrase in text for phrase in phrases):
            return DatabaseUnavailable(f"The database {path} {why}. It was left as it is ({exc}).")
    return None


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
    version: int = 1  # of the versions of this turn (a regenerated reply, an edited message), from 1
    versions: int = 1


@dataclass
class SearchHit:
    conversation: Conversation
    snippet: str = ""  # the first matching message around the hit, each hit between HIT_START and HIT_END
    message_id: int | None = None  # that message; None when only the title matched


def fts_query(text: str) -> str:
    """`text` as an FTS5 query that is never a syntax error: each word a quoted string, all of them
    required, the last one a prefix while it is being typed. "" when `text` has no word."""
    words = [w for w in text.split() if any(ch.isalnum() for ch in w)]
    terms = ['"' + w.replace('"', '""') + '"' for w in words]
    if words and text.endswith(words[-1]):  # still being typed
        terms[-1] += "*"
    return " ".join(terms)


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
        try:
            db = sqlite3.connect(self.path, isolation_level=None)  # autocommit; explicit transactions below
        except sqlite3.Error as exc:
            raise _unusable(self.path, exc) or exc
        db.row_factory = sqlite3.Row
        try:
            if not fresh:
                check = db.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    raise sqlite3.DatabaseError(f"integrity check failed: {check}")
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            db.close()
            unusable = _unusable(self.path, exc)
            if unusable is not None:
                raise unusable from exc
            aside = self._move_aside("corrupt")
            raise DatabaseMovedAside(
                f"The database {self.path} could not be read ({exc}). It was moved to {aside.name}, unchanged, "
                "and a new one was started."
            ) from exc
        if version > SCHEMA_VERSION:
            db.close()
            aside = self._move_aside(f"newer-v{version}")
            raise DatabaseMovedAside(
                f"The database {self.path} was written by a newer FlashDesk (schema version {version}; this "
                f"version knows {SCHEMA_VERSION}). It was moved to {aside.name}, unchanged, and a new one "
                "was started. Open it with the newer FlashDesk to get those conversations back."
            )
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
            self._migrate(db, version)  # any other failure here is our bug, not a bad file: raised, nothing moved
            db.execute("UPDATE messages SET state = ? WHERE state = ?", (INTERRUPTED, STREAMING))
        except sqlite3.Error as exc:
            db.close()
            unusable = _unusable(self.path, exc)
            if unusable is not None:
                raise unusable from exc
            raise
        # no index when the sqlite3 that migrated the database lacked FTS5: search then uses LIKE
        self.fts = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'message_search'").fetchone() is not None
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
                _rollback(db)
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
        self.db.execute(
            "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )

    # -- conversations -------------------------------------------------------------------------------

    def conversations(self) -> list[Conversation]:
        """Newest first."""
        rows = self.db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC")
        return [_conversation(r) for r in rows]

    def search(self, query: str) -> list[SearchHit]:
        """The conversations whose title or a message (in any branch) has every word of `query` (the
        last one as a prefix), newest first, each with its first matching message (in the branch
        shown where one matches) and a snippet of it; every conversation when `query` is blank. A
        query of punctuation only is looked for as it is."""
        query = query.replace("\x00", "")  # pasted, it would end the text SQLite's LIKE sees
        expression = fts_query(query)
        if not query.strip():
            return [SearchHit(c) for c in self.conversations()]
        if not self.fts or not expression:
            return self._search_like(query.strip())
        titles = {
            r[0] for r in self.db.execute("SELECT rowid FROM title_search WHERE title_search MATCH ?", (expression,))
        }
        first = dict(
            self.db.execute(
                "SELECT m.conversation_id, MIN(m.id) FROM message_search s JOIN messages m ON m.id = s.rowid "
                "WHERE message_search MATCH ? GROUP BY m.conversation_id",
                (expression,),
            ).fetchall()
        )
        self._prefer_the_branch_shown(
            first,
            "SELECT m.id FROM message_search s JOIN messages m ON m.id = s.rowid "
            "WHERE message_search MATCH :query AND m.conversation_id = :conversation ORDER BY m.id",
            expression,
        )
        return [
            SearchHit(c, self._snippet(expression, first[c.id]) if c.id in first else "", first.get(c.id))
            for c in self.conversations()
            if c.id in titles or c.id in first
        ]

    def _snippet(self, expression: str, message_id: int) -> str:
        row = self.db.execute(
            f"SELECT snippet(message_search, 0, ?, ?, '…', {SNIPPET_TOKENS}) FROM message_search "
            "WHERE message_search MATCH ? AND rowid = ?",
            (HIT_START, HIT_END, expression, message_id),
        ).fetchone()
        return " ".join(row[0].split())

    def _search_like(self, text: str) -> list[SearchHit]:
        """Without FTS5, or for punctuation: `text` as it is, in titles and messages (case-insensitive for ASCII)."""
        pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.db.execute(
            "SELECT c.*, (SELECT MIN(m.id) FROM messages m WHERE m.conversation_id = c.id "
            "AND m.content LIKE :p ESCAPE '\\') AS first_id FROM conversations c "
            "WHERE first_id IS NOT NULL OR c.title LIKE :p ESCAPE '\\' ORDER BY c.updated DESC, c.id DESC",
            {"p": pattern},
        ).fetchall()
        first = {r["id"]: r["first_id"] for r in rows if r["first_id"] is not None}
        self._prefer_the_branch_shown(
            first,
            "SELECT id FROM messages WHERE conversation_id = :conversation AND content LIKE :query ESCAPE '\\' "
            "ORDER BY id",
            pattern,
        )
        return [
            SearchHit(
                _conversation(r),
                _marked(self.message(first[r["id"]]).content, text) if r["id"] in first else "",
                first.get(r["id"]),
            )
            for r in rows
        ]

    def _prefer_the_branch_shown(self, first: dict[int, int], matches: str, query: str) -> None:
        """In `first` (conversation -> its first matching message), a conversation with branches gets
        its first match in the branch shown instead, where there is one: opening that hit leaves the
        conversation as the user left it. `matches`: the SQL of a conversation's matches, in order."""
        branched = self.db.execute("SELECT DISTINCT conversation_id FROM messages WHERE hidden = 1")
        for conversation_id in first.keys() & {r[0] for r in branched}:
            shown = set(self._branch_ids(conversation_id))
            ids = self.db.execute(matches, {"query": query, "conversation": conversation_id})
            first[conversation_id] = next((r[0] for r in ids if r[0] in shown), first[conversation_id])

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return _conversation(row) if row else None

    def create_conversation(
        self, title: str = "New conversation", system_prompt: str = "", sampling: dict | None = None
    ) -> Conversation:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO conversations (title, created, updated, system_prompt, sampling) VALUES (?, ?, ?, ?, ?)",
            (title, now, now, system_prompt, json.dumps(sampling or {})),
        )
        return self.conversation(cur.lastrowid)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def update_conversation(self, conversation_id: int, system_prompt: str, sampling: dict) -> None:
        self.db.execute(
            "UPDATE conversations SET system_prompt = ?, sampling = ? WHERE id = ?",
            (system_prompt, json.dumps(sampling), conversation_id),
        )

    def touch(self, conversation_id: int) -> None:
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages ------------------------------------------------------------------------------------

    def messages(self, conversation_id: int) -> list[Message]:
        """The branch shown, in order: what the window shows, export writes and the engine is given."""
        rows = self.db.execute(
            f"{_BRANCH} SELECT {_MESSAGE_COLUMNS} FROM branch JOIN messages m ON m.id = branch.id "
            "LEFT JOIN thoughts t ON t.message_id = m.id LEFT JOIN message_stats s ON s.message_id = m.id "
            "ORDER BY m.id",
            {"conversation": conversation_id},
        )
        return [_message(r) for r in rows]

    def _branch_ids(self, conversation_id: int) -> list[int]:
        rows = self.db.execute(f"{_BRANCH} SELECT id FROM branch ORDER BY id", {"conversation": conversation_id})
        return [r[0] for r in rows]

    def versions(self, message_id: int) -> list[Message]:
        """Every version of the turn `message_id` belongs to (the messages that follow the same one),
        oldest first; one when it was never regenerated or edited."""
        rows = self.db.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages o "
            "JOIN messages m ON m.conversation_id = o.conversation_id AND m.parent_id IS o.parent_id "
            "LEFT JOIN thoughts t ON t.message_id = m.id LEFT JOIN message_stats s ON s.message_id = m.id "
            "WHERE o.id = ? ORDER BY m.id",
            (message_id,),
        )
        return [_message(r) for r in rows]

    def choose_version(self, message_id: int) -> None:
        """Show the version `message_id` of its turn, and the branch that follows it as it was left."""
        self._in_transaction(lambda: self._choose(message_id))

    def choose_branch(self, message_id: int) -> None:
        """Show the branch `message_id` lies in (a search hit in a branch not shown): it and every
        message before it become the chosen versions of their turns."""

        def write() -> None:
            for set_aside in self._set_aside_on_the_way_to(message_id):
                self._choose(set_aside)

        self._in_transaction(write)

    def _set_aside_on_the_way_to(self, message_id: int) -> list[int]:
        """`message_id` and the messages before it (its parent, the parent's parent...) not chosen now."""
        rows = self.db.execute(
            "WITH RECURSIVE path(id, parent_id) AS (SELECT id, parent_id FROM messages WHERE id = ? "
            "UNION SELECT m.id, m.parent_id FROM messages m JOIN path ON m.id = path.parent_id) "
            "SELECT m.id FROM path JOIN messages m ON m.id = path.id WHERE m.hidden = 1",
            (message_id,),
        )
        return [r[0] for r in rows]

    def _choose(self, message_id: int) -> None:
        """Within a transaction: `message_id` becomes the one version shown of its turn."""
        self.db.execute(
            "UPDATE messages SET hidden = (id != :id) "
            "WHERE conversation_id = (SELECT conversation_id FROM messages WHERE id = :id) "
            "AND parent_id IS (SELECT parent_id FROM messages WHERE id = :id)",
            {"id": message_id},
        )

    def _in_transaction(self, write: Callable[[], Any]) -> Any:
        """Run `write` as one transaction: all of it is kept, or, when it fails, none of it."""
        self.db.execute("BEGIN")
        try:
            result = write()
            self.db.execute("COMMIT")
        except BaseException:
            _rollback(self.db)
            raise
        return result

    def message(self, message_id: int) -> Message | None:
        row = self.db.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages m "
            "LEFT JOIN thoughts t ON t.message_id = m.id LEFT JOIN message_stats s ON s.message_id = m.id "
            "WHERE m.id = ?",
            (message_id,),
        ).fetchone()
        return _message(row) if row else None

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str = "",
        state: str = COMPLETE,
        model: str | None = None,
        version_of: int | None = None,
    ) -> Message:
        """A new message at the end of the branch shown; with `version_of`, a new version of that
        message instead (a regenerated reply, an edited message): it follows what that one follows.
        Either way it is the version shown now; the others stay, with all that follows them."""
        now = time.time()

        def write() -> int:
            parent = self._parent_of_new(conversation_id, version_of)
            self.db.execute(
                "UPDATE messages SET hidden = 1 WHERE conversation_id = ? AND parent_id IS ?", (conversation_id, parent)
            )
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, state, model, created, "
                "updated, parent_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, state, model, now, now, parent),
            )
            self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
            return cur.lastrowid

        return self.message(self._in_transaction(write))

    def _parent_of_new(self, conversation_id: int, version_of: int | None) -> int | None:
        """The message a new one follows: the last of the branch shown, or what `version_of` follows."""
        if version_of is None:
            return self.db.execute(
                f"{_BRANCH} SELECT MAX(id) FROM branch", {"conversation": conversation_id}
            ).fetchone()[0]
        row = self.db.execute(
            "SELECT parent_id FROM messages WHERE id = ? AND conversation_id = ?", (version_of, conversation_id)
        ).fetchone()
        if row is None:
            raise LookupError(f"no message {version_of} in conversation {conversation_id}")
        return row[0]

    def update_message(
        self,
        message_id: int,
        *,
        content: str | None = None,
        state: str | None = None,
        thought: str | None = None,
        thought_seconds: float | None = None,
        stats: dict | None = None,
    ) -> None:
        """Change what is given, in one transaction."""
        now = time.time()
        self.db.execute("BEGIN")
        try:
            if content is not None:
                self.db.execute("UPDATE messages SET content = ?, updated = ? WHERE id = ?", (content, now, message_id))
            if state is not None:
                self.db.execute("UPDATE messages SET state = ?, updated = ? WHERE id = ?", (state, now, message_id))
            if thought is not None:
                self.db.execute(
                    "INSERT INTO thoughts (message_id, text, seconds) VALUES (?, ?, ?) ON CONFLICT "
                    "(message_id) DO UPDATE SET text = excluded.text, seconds = excluded.seconds",
                    (message_id, thought, thought_seconds),
                )
            if stats is not None:
                self.db.execute(
                    "INSERT INTO message_stats (message_id, data) VALUES (?, ?) ON CONFLICT "
                    "(message_id) DO UPDATE SET data = excluded.data",
                    (message_id, json.dumps(stats)),
                )
            self.db.execute("COMMIT")
        except BaseException:
            _rollback(self.db)
            raise

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Delete this message and all that follows it, in every branch (a turn the engine refused).
        When it was the version shown, the version before it shows again (or, for a first one, the
        one after it), with what follows that one."""

        def write() -> None:
            row = self.db.execute(
                "SELECT parent_id, hidden FROM messages WHERE id = ? AND conversation_id = ?",
                (message_id, conversation_id),
            ).fetchone()
            if row is None:
                return
            self.db.execute(
                "WITH RECURSIVE gone(id) AS (SELECT :id UNION SELECT m.id FROM messages m JOIN gone "
                "ON m.conversation_id = :conversation AND m.parent_id = gone.id) "
                "DELETE FROM messages WHERE id IN gone",
                {"id": message_id, "conversation": conversation_id},
            )
            if not row["hidden"]:
                self.db.execute(
                    "UPDATE messages SET hidden = 0 WHERE id = (SELECT id FROM messages "
                    "WHERE conversation_id = :conversation AND parent_id IS :parent "
                    "ORDER BY id > :id, CASE WHEN id < :id THEN -id ELSE id END LIMIT 1)",
                    {"conversation": conversation_id, "parent": row["parent_id"], "id": message_id},
                )

        self._in_transaction(write)


def _rollback(db: sqlite3.Connection) -> None:
    """Undo the open transaction, unless SQLite already has (it does after a full disk or an I/O
    error, and a second ROLLBACK would hide that error behind "no transaction is active")."""
    if db.in_transaction:
        db.execute("ROLLBACK")


def _marked(content: str, text: str) -> str:
    """The snippet of the LIKE fallback: `content` around the first `text`, the hit marked."""
    found = re.search(re.escape(text), content, re.IGNORECASE)
    start, end = found.span()
    before = content[max(0, start - SNIPPET_CHARS) : start]
    after = content[end : end + SNIPPET_CHARS]
    snippet = (
        ("…" if start > SNIPPET_CHARS else "")
        + before
        + HIT_START
        + content[start:end]
        + HIT_END
        + after
        + ("…" if end + SNIPPET_CHARS < len(content) else "")
    )
    return " ".join(snippet.split())


def _conversation(row: sqlite3.Row) -> Conversation:
    try:
        sampling = json.loads(row["sampling"]) or {}
    except ValueError:
        sampling = {}
    return Conversation(row["id"], row["title"], row["created"], row["updated"], row["system_prompt"], sampling)


# a message with its thought, statistics, and its place among the versions of its turn (its siblings)
_SIBLINGS = "FROM messages v WHERE v.conversation_id = m.conversation_id AND v.parent_id IS m.parent_id"
_MESSAGE_COLUMNS = (
    "m.*, t.text AS thought, t.seconds AS thought_seconds, s.data AS stats, "
    f"(SELECT COUNT(*) {_SIBLINGS}) AS versions, (SELECT COUNT(*) {_SIBLINGS} AND v.id <= m.id) AS version"
)

# the ids of the branch shown of conversation :conversation, as the table `branch`
_BRANCH = (
    "WITH RECURSIVE branch(id) AS ("
    "SELECT id FROM messages WHERE conversation_id = :conversation AND parent_id IS NULL AND hidden = 0 "
    "UNION SELECT m.id FROM messages m JOIN branch ON m.conversation_id = :conversation "
    "AND m.parent_id = branch.id AND m.hidden = 0)"
)


def _message(row: sqlite3.Row) -> Message:
    stats = None
    if row["stats"]:
        try:
            stats = json.loads(row["stats"])
        except ValueError:
            stats = None
    return Message(
        row["id"],
        row["conversation_id"],
        row["role"],
        row["content"],
        row["state"],
        row["created"],
        row["updated"],
        row["model"],
        row["thought"] or "",
        row["thought_seconds"],
        stats,
        row["version"],
        row["versions"],
    )
