"""A database that is sound but cannot be used now (locked, read-only) is refused and left exactly as
it is, never moved aside as if it were corrupt; a write that fails on a full disk raises SQLite's own
error and keeps every row committed before it."""

from __future__ import annotations

import functools
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flashdesk.app.history.store import DatabaseUnavailable, Store


def _populated(path: Path) -> list[tuple]:
    store = Store(path)
    conv = store.create_conversation("Tide tables")
    store.add_message(conv.id, "user", "When is high tide?")
    store.add_message(conv.id, "assistant", "Twice a day.")
    store.close()
    return _rows(path)


def _rows(path: Path) -> list[tuple]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT id, role, content, state FROM messages ORDER BY id").fetchall()
    finally:
        db.close()


def test_a_locked_database_is_refused_and_left_alone(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "flashdesk.db"
    before = _populated(path)
    other = sqlite3.connect(path, isolation_level=None)  # another program holds the write lock
    other.execute("PRAGMA locking_mode=EXCLUSIVE")
    other.execute("BEGIN EXCLUSIVE")
    try:
        with monkeypatch.context() as m, pytest.raises(DatabaseUnavailable, match="locked by another program"):
            # SQLite waits for a lock 5 s by default before it says the database is locked: the
            # same refusal, a tenth of a second into the wait
            m.setattr(sqlite3, "connect", functools.partial(sqlite3.connect, timeout=0.1))
            Store(path)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name] == []
    assert _rows(path) == before
    again = Store(path)  # the lock gone, it opens as it was
    assert again.notice is None and [m.content for m in again.messages(1)] == ["When is high tide?", "Twice a day."]
    again.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file modes (reliability.py mounts a read-only tmpfs)")
def test_a_read_only_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "data" / "flashdesk.db"
    path.parent.mkdir()
    before = _populated(path)
    path.chmod(0o444)
    path.parent.chmod(0o555)
    try:
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            Store(path)
        assert sorted(p.name for p in path.parent.iterdir()) == ["flashdesk.db"]
    finally:
        path.parent.chmod(0o755)
        path.chmod(0o644)
    assert _rows(path) == before


FILL_UNTIL_FULL = textwrap.dedent("""
    import resource, signal, sqlite3, sys
    from pathlib import Path
    from flashdesk.app.history.store import STREAMING, Store

    path = Path(sys.argv[1])
    store = Store(path)
    conv = store.create_conversation("Tide tables")
    store.add_message(conv.id, "user", "When is high tide?")
    reply = store.add_message(conv.id, "assistant", "", STREAMING)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails (EFBIG), as on a full disk
    limit = max(p.stat().st_size for p in path.parent.iterdir()) + 32 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    text = ""
    try:
        for i in range(100000):
            text += f"tide {i} "
            store.update_message(reply.id, content=text)
            saved = text
    except sqlite3.Error as exc:
        print(saved)
        print(exc)
    try:
        store.add_message(conv.id, "user", "And tomorrow?")
    except sqlite3.Error as exc:
        print(exc)
""")


def test_a_write_that_fails_on_a_full_disk_says_so_and_keeps_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "flashdesk.db"
    run = subprocess.run(
        [sys.executable, "-c", FILL_UNTIL_FULL, str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    saved, failed, then = run.stdout.splitlines()
    # SQLite's own error, not "cannot rollback - no transaction is active" hiding it (SQLite had
    # already rolled the transaction back), and the next write is refused for the same reason
    assert "disk" in failed and "rollback" not in failed, failed
    assert "disk" in then and "transaction" not in then, then
    store = Store(path)  # as the next start opens it: nothing moved aside, every committed row there
    assert store.notice is None
    user, reply = store.messages(1)
    assert (user.content, reply.content, reply.state) == ("When is high tide?", saved, "interrupted")
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store.close()
