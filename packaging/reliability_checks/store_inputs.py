"""The database's bad inputs: a corrupt, damaged, newer, locked or read-only database at start, a
disk that fills while a reply is saved, and text with control characters. Each must be said
specifically and lose nothing: a database moved aside keeps its bytes, one left alone keeps its
rows, and a full disk costs only what could not be written.

A read-only folder and a full disk need a filesystem of their own: a tmpfs is mounted where this
runs as root with the right to mount; otherwise file modes make the folder read-only (root ignores
them, so that case is skipped, with the reason) and RLIMIT_FSIZE caps how large the app's files
may grow (a write past it fails as a full disk's would, with EFBIG, which SQLite calls an I/O error).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

from .child import FILLER, RLIMIT, TMPFS
from .common import ANSWER_S, START_S, integrity
from .inputs import Case, Skip
from .kills import ChildEvents, run_child

DISK_ROOM = 256 * 1024  # bytes left to the database when the reply starts: a few saves' worth (schema v4's
# indexes make a message's first write take more than the 64 KiB this was)
TMPFS_SIZE = "8m"


def rows(path: Path) -> list[tuple]:
    """Every conversation and message the database at `path` holds, in a plain connection."""
    db = sqlite3.connect(path, timeout=10)
    try:
        return (
            db.execute("SELECT id, title FROM conversations ORDER BY id").fetchall()
            + db.execute("SELECT id, role, content, state FROM messages ORDER BY id").fetchall()
        )
    finally:
        db.close()


def populated(path: Path, conversations: int = 30) -> list[tuple]:
    """A database of the app's with some conversations, cleanly closed; its rows."""
    from flashdesk.app.history.store import COMPLETE, Store

    store = Store(path)
    for i in range(conversations):
        conv = store.create_conversation(f"Conversation {i} about tide tables")
        store.add_message(conv.id, "user", f"Question {i}: when is high tide?")
        store.add_message(conv.id, "assistant", f"Answer {i}: twice a day. " * 20, COMPLETE)
    store.close()
    return rows(path)


def can_mount() -> bool:
    """Whether tmpfs can be mounted here (root, and a kernel and container that allow it)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"flashdesk-mount-probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        if (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], capture_output=True
            ).returncode
            != 0
        ):
            return False
        subprocess.run(["umount", str(probe)], check=True, capture_output=True)
        return True
    finally:
        probe.rmdir()


@contextlib.contextmanager
def tmpfs(folder: Path, size: str):
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True, capture_output=True
    )
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _moved_aside(path: Path, kind: str, phrase: str, before: bytes) -> str | None:
    """Store(path) must move the database aside saying `phrase`, keep its bytes, and start afresh."""
    from flashdesk.app.history.store import Store

    store = Store(path)
    try:
        if not store.notice or phrase.lower() not in store.notice.lower():
            return f"the notice does not say {phrase!r}: {store.notice!r}"
        aside = [
            f
            for f in path.parent.iterdir()
            if f.name.startswith(f"{path.name}.{kind}") and not f.name.endswith(("-wal", "-shm"))
        ]
        if len(aside) != 1 or aside[0].read_bytes() != before:
            return f"the database was not kept as it was: {[f.name for f in aside]}"
        store.create_conversation("after")
        return None if [c.title for c in store.conversations()] == ["after"] else "the new database does not work"
    finally:
        store.close()


def _left_alone(path: Path, phrase: str, before: list[tuple]) -> str | None:
    """Store(path) must refuse with DatabaseUnavailable saying `phrase` and touch nothing."""
    from flashdesk.app.history.store import DatabaseUnavailable, Store

    try:
        Store(path).close()
        return "it opened (no error)"
    except DatabaseUnavailable as exc:
        if phrase.lower() not in str(exc).lower():
            return f"the error does not say {phrase!r}: {exc}"
    except Exception as exc:  # noqa: BLE001 - any other error is the wrong one
        return f"{type(exc).__name__}, not DatabaseUnavailable: {exc}"
    aside = [f.name for f in path.parent.iterdir() if f.name.startswith(f"{path.name}.")]
    return f"moved aside: {aside}" if aside else None


def store_cases(folder: Path, demo: tuple[Path, Path], mountable: bool) -> list[Case]:
    def case_path(name: str) -> Path:
        (folder / name).mkdir(parents=True, exist_ok=True)
        return folder / name / "flashdesk.db"

    def corrupt() -> str | None:
        path = case_path("corrupt")
        garbage = b"this is not a database at all\x00\x01" * 100
        path.write_bytes(garbage)
        return _moved_aside(path, "corrupt", "could not be read", garbage)

    def damaged() -> str | None:
        path = case_path("damaged")
        populated(path)
        data = bytearray(path.read_bytes())
        data[4096 : 4096 + 64] = b"\xff" * 64  # the b-tree header of the second page
        path.write_bytes(bytes(data))
        return _moved_aside(path, "corrupt", "could not be read", bytes(data))

    def newer() -> str | None:
        path = case_path("newer")
        populated(path)
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version = 99")
        db.close()
        return _moved_aside(path, "newer-v99", "newer FlashDesk", path.read_bytes())

    def locked() -> str | None:
        path = case_path("locked")
        before = populated(path)
        other = sqlite3.connect(path, isolation_level=None)  # another program holding the write lock
        other.execute("PRAGMA locking_mode=EXCLUSIVE")
        other.execute("BEGIN EXCLUSIVE")
        try:
            problem = _left_alone(path, "locked by another program", before)
        finally:
            other.execute("ROLLBACK")
            other.close()
        return problem or (None if rows(path) == before else "its rows changed")

    def read_only() -> str | None:
        if os.geteuid() != 0:
            path = case_path("read-only")
            before = populated(path)
            path.chmod(0o444)
            path.parent.chmod(0o555)
            try:
                problem = _left_alone(path, "read-only", before)
            finally:
                path.parent.chmod(0o755)
                path.chmod(0o644)
            return problem or (None if rows(path) == before else "its rows changed")
        if not mountable:
            raise Skip("running as root (file modes do not bind root) without the right to mount a read-only tmpfs")
        with tmpfs(folder / "read-only-mount", "4m") as mount:
            path = mount / "flashdesk.db"
            before = populated(path)
            subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True, capture_output=True)
            problem = _left_alone(path, "read-only", before)
            subprocess.run(["mount", "-o", "remount,rw", str(mount)], check=True, capture_output=True)
            return problem or (None if rows(path) == before else "its rows changed")

    def full_disk() -> str | None:
        if mountable:
            with tmpfs(folder / "full-mount", TMPFS_SIZE) as mount:
                return _full_disk_while_saving(mount / "flashdesk.db", demo, folder, TMPFS, "disk is full")
        return _full_disk_while_saving(case_path("full-rlimit"), demo, folder, RLIMIT, "disk I/O error")

    def control_characters() -> str | None:
        from flashdesk.app.history.store import Store

        text = "tide\x00 \x1b[31mred\x1b[0m \x07\x7f\x08 \r\n \u202eevil\u202c end"
        path = case_path("control")
        store = Store(path)
        try:
            conv = store.create_conversation("control characters")
            message = store.add_message(conv.id, "user", text)
        finally:
            store.close()
        store = Store(path)
        try:
            if store.message(message.id).content != text:
                return f"read back as {store.message(message.id).content!r}"
            return None if [h.conversation.id for h in store.search("tide")] == [conv.id] else "search misses it"
        finally:
            store.close()

    return [
        Case("database_corrupt", "moved aside unchanged: 'could not be read'", corrupt),
        Case("database_damaged_page", "moved aside unchanged: 'could not be read'", damaged),
        Case("database_newer", "moved aside unchanged: 'newer FlashDesk'", newer),
        Case("database_locked", "refused, left alone: 'locked by another program'", locked),
        Case("database_read_only", "refused, left alone: 'read-only'", read_only),
        Case(
            "database_full_disk_while_saving",
            "said once ('could not be saved'), the reply ends, earlier rows intact, integrity ok",
            full_disk,
        ),
        Case("database_control_characters", "stored and read back unchanged, found by search", control_characters),
    ]


def _full_disk_while_saving(db: Path, demo, folder: Path, how: str, phrase: str) -> str | None:
    """The app streams a long reply with DISK_ROOM bytes of disk left: the failed saves are said (the
    notice), the reply still ends, and afterwards the database opens with every earlier row and
    what was saved of the reply (a prefix of what was shown)."""
    from flashdesk.app.history.store import Store

    before = populated(db, conversations=3)
    child = run_child(
        db, demo, folder / "full-disk.log", "--max-tokens", "600", "--disk-room", str(DISK_ROOM), "--disk-limit", how
    )
    events = ChildEvents(child)
    try:
        events.next(START_S)
        events.rest(ANSWER_S * 3)
    finally:
        if child.poll() is None:
            child.kill()
        code = child.wait()
        child.stdout.close()
    (db.parent / FILLER).unlink(missing_ok=True)
    notice, ended = events.last("notice"), events.last("ended")
    shown = [e["text"] for e in events.seen if e["event"] == "shown"]
    if notice is None or phrase.lower() not in notice["text"].lower() or "could not be saved" not in notice["text"]:
        return f"no notice saying the reply could not be saved ({phrase}): {notice}; exit code {code}"
    if ended is None or code != 0:
        return f"the reply did not end (exit code {code}; see {folder / 'full-disk.log'})"
    if sum(e["event"] == "notice" for e in events.seen) != 1:
        return "the notice was given more than once for one reply"
    store = Store(db)
    try:
        if store.notice:
            return f"the next start moved the database aside: {store.notice}"
        reply = store.message(ended["message"])
        if reply is None or not shown or not shown[-1].startswith(reply.content):
            return "the stored reply is not what was shown"
    finally:
        store.close()
    after = rows(db)
    changed = [row for row in before if row not in after]
    if changed:
        return f"{len(changed)} rows saved before the disk filled changed or went"
    check = integrity(db)
    return None if check == "ok" else f"integrity_check: {check}"
