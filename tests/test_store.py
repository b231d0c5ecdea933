"""The app's SQLite store: what it keeps, migrations, and that a bad database is moved aside, never overwritten."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from flashdesk.app import store as store_module
from flashdesk.app.store import (CANCELLED, INTERRUPTED, SCHEMA_VERSION, STREAMING, Store)


def test_conversations_messages_thoughts_stats_settings(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    assert s.notice is None
    a = s.create_conversation("Rust lifetimes", system_prompt="Be brief.", sampling={"temperature": 0.2})
    b = s.create_conversation("Cooking pasta")
    user = s.add_message(a.id, "user", "What is 'a?")
    reply = s.add_message(a.id, "assistant", "", STREAMING, model="gemma")
    s.update_message(reply.id, content="A lifetime.", thought="Think...", thought_seconds=1.5,
                     state=CANCELLED, stats={"tokens": 3, "origins": [[2, "d"], [9, "t"]]})
    got = s.messages(a.id)
    assert [m.id for m in got] == [user.id, reply.id]
    assert got[1].content == "A lifetime." and got[1].thought == "Think..." and got[1].thought_seconds == 1.5
    assert got[1].state == CANCELLED and got[1].model == "gemma"
    assert got[1].stats == {"tokens": 3, "origins": [[2, "d"], [9, "t"]]}
    assert s.conversation(a.id).system_prompt == "Be brief."
    assert s.conversation(a.id).sampling == {"temperature": 0.2}

    assert [c.title for c in s.conversations("PASTA")] == ["Cooking pasta"]
    assert [c.title for c in s.conversations("%")] == []  # LIKE wildcards are literal
    s.rename_conversation(b.id, "Pasta al dente")
    assert s.conversation(b.id).title == "Pasta al dente"
    # the conversation written to last comes first
    assert [c.id for c in s.conversations()][0] == a.id

    s.set_setting("model", {"target": "/m", "draft": None})
    assert s.setting("model") == {"target": "/m", "draft": None}
    assert s.setting("missing", 7) == 7

    s.delete_messages_from(a.id, reply.id)
    assert [m.id for m in s.messages(a.id)] == [user.id]
    s.delete_conversation(a.id)
    assert s.messages(a.id) == [] and s.conversation(a.id) is None
    # thoughts and stats went with their messages (foreign keys cascade)
    assert s.db.execute("SELECT COUNT(*) FROM thoughts").fetchone()[0] == 0
    assert s.db.execute("SELECT COUNT(*) FROM message_stats").fetchone()[0] == 0
    s.close()


def test_wal_and_schema_version(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    s.close()


def test_streaming_message_is_interrupted_after_a_crash(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    conv = s.create_conversation()
    m = s.add_message(conv.id, "assistant", "", STREAMING)
    s.update_message(m.id, content="partial answ")
    # no close: the app died
    again = Store(tmp_path / "f.db")
    got = again.message(m.id)
    assert got.state == INTERRUPTED and got.content == "partial answ"
    again.close()
    s.close()


def test_corrupt_database_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "flashdesk.db"
    garbage = b"this is not a database at all\x00\x01" * 100
    path.write_bytes(garbage)
    s = Store(path)
    assert s.notice and "moved" in s.notice and "could not be read" in s.notice
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("flashdesk.db.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == garbage  # kept unchanged
    assert aside[0].name in s.notice
    s.create_conversation("fresh")  # the new database works
    assert [c.title for c in s.conversations()] == ["fresh"]
    s.close()


def test_damaged_database_page_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "flashdesk.db"
    s = Store(path)
    for i in range(200):
        s.create_conversation(f"conversation {i}" * 20)
    s.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.close()
    data = bytearray(path.read_bytes())
    data[4096:4096 + 64] = b"\xff" * 64  # scribble over the b-tree header of the second page
    path.write_bytes(bytes(data))
    again = Store(path)
    assert again.notice and "moved" in again.notice
    assert again.conversations() == []
    again.close()


def test_newer_database_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "flashdesk.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE future (x)")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    db.commit()
    db.close()
    before = path.read_bytes()
    s = Store(path)
    assert s.notice and "newer FlashDesk" in s.notice
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(f"flashdesk.db.newer-v{SCHEMA_VERSION + 5}-")]
    assert len(aside) == 1 and aside[0].read_bytes() == before
    s.close()


def test_migrates_an_empty_database(tmp_path: Path) -> None:
    path = tmp_path / "flashdesk.db"
    sqlite3.connect(path).close()  # version 0, no tables
    s = Store(path)
    assert s.notice is None
    assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    s.close()


def test_failed_migration_changes_nothing_and_moves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in a migration must not cost the user their database: it is rolled back and raised."""
    path = tmp_path / "flashdesk.db"
    Store(path).close()
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(store_module.MIGRATIONS, SCHEMA_VERSION + 1,
                        ["CREATE TABLE extra (x)", "THIS IS NOT SQL"])
    with pytest.raises(sqlite3.OperationalError):
        Store(path)
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name] == []
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'extra'").fetchone() is None
    db.close()
