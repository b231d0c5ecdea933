"""The app's SQLite store: what it keeps, migrations, and that a bad database is moved aside, never overwritten."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from flashdesk.app.history import store as store_module
from flashdesk.app.history.store import (
    CANCELLED,
    HIT_END,
    HIT_START,
    INTERRUPTED,
    MIGRATIONS,
    SCHEMA_VERSION,
    STREAMING,
    Store,
    fts_query,
)


def test_conversations_messages_thoughts_stats_settings(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    assert s.notice is None
    a = s.create_conversation("Rust lifetimes", system_prompt="Be brief.", sampling={"temperature": 0.2})
    b = s.create_conversation("Cooking pasta")
    user = s.add_message(a.id, "user", "What is 'a?")
    reply = s.add_message(a.id, "assistant", "", STREAMING, model="gemma")
    s.update_message(
        reply.id,
        content="A lifetime.",
        thought="Think...",
        thought_seconds=1.5,
        state=CANCELLED,
        stats={"tokens": 3, "origins": [[2, "d"], [9, "t"]]},
    )
    got = s.messages(a.id)
    assert [m.id for m in got] == [user.id, reply.id]
    assert got[1].content == "A lifetime." and got[1].thought == "Think..." and got[1].thought_seconds == 1.5
    assert got[1].state == CANCELLED and got[1].model == "gemma"
    assert got[1].stats == {"tokens": 3, "origins": [[2, "d"], [9, "t"]]}
    assert s.conversation(a.id).system_prompt == "Be brief."
    assert s.conversation(a.id).sampling == {"temperature": 0.2}

    assert [h.conversation.title for h in s.search("PASTA")] == ["Cooking pasta"]
    assert [h.conversation.title for h in s.search("%")] == []  # LIKE wildcards are literal
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
    data[4096 : 4096 + 64] = b"\xff" * 64  # scribble over the b-tree header of the second page
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
    monkeypatch.setitem(store_module.MIGRATIONS, SCHEMA_VERSION + 1, ["CREATE TABLE extra (x)", "THIS IS NOT SQL"])
    with pytest.raises(sqlite3.OperationalError):
        Store(path)
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name] == []
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'extra'").fetchone() is None
    db.close()


def test_fts_query_quotes_every_word() -> None:
    assert fts_query("rust  life") == '"rust" "life"*'  # all words, the last a prefix while typed
    assert fts_query("rust life ") == '"rust" "life"'
    assert fts_query('say "hi') == '"say" """hi"*'  # a quote is doubled inside the string
    assert fts_query("a-b NEAR( c:d *") == '"a-b" "NEAR(" "c:d"'  # syntax is text; no word in "*"
    assert fts_query(" ?! ") == "" and fts_query("") == ""


def test_search_finds_message_text_and_marks_the_hit(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    assert s.fts  # this Python's sqlite3 has FTS5
    rust = s.create_conversation("Rust lifetimes")
    question = s.add_message(rust.id, "user", "Why does the borrow checker complain?")
    s.add_message(rust.id, "assistant", "The borrow ends too late.")
    pasta = s.create_conversation("Cooking")
    boil = s.add_message(pasta.id, "user", "How long do I boil pasta?\n\n" + "Salt the water well. " * 10)
    s.add_message(pasta.id, "assistant", "Ten minutes; then taste the pasta.")

    [hit] = s.search("checker")
    assert (hit.conversation.id, hit.message_id) == (rust.id, question.id)
    assert hit.snippet == f"Why does the borrow {HIT_START}checker{HIT_END} complain?"
    [hit] = s.search("BOIL past")  # every word, in any case, the last one a prefix as it is typed
    assert hit.message_id == boil.id and f"{HIT_START}boil{HIT_END} {HIT_START}pasta{HIT_END}?" in hit.snippet
    assert hit.snippet.endswith("…") and "\n" not in hit.snippet and len(hit.snippet) < 100
    assert [h.message_id for h in s.search("borrow")] == [question.id]  # the first matching message
    assert _titles(s, "lifetime") == ["Rust lifetimes"] and s.search("lifetime")[0].snippet == ""  # the title
    assert _titles(s, "the") == ["Cooking", "Rust lifetimes"]  # newest first
    assert _titles(s, "") == ["Cooking", "Rust lifetimes"] and _titles(s, "nothing here") == []
    s.close()


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '"borrow',
        "borrow-checker",
        "a:b",
        "*",
        "borrow*",
        "NEAR(",
        "(",
        ")",
        "AND",
        "OR NOT",
        "^",
        "-",
        "'",
        "'; DROP TABLE messages; --",
        "\\",
        "%_",
        "\x00",
        "\u2603",
        "title:borrow",
        "{content}: x",
        "borrow + -checker",
    ],
)
def test_weird_queries_do_not_raise(tmp_path: Path, query: str) -> None:
    s = Store(tmp_path / "f.db")
    conv = s.create_conversation("Symbols")
    s.add_message(conv.id, "user", "a borrow-checker, a:b and 100% of C++ (really) -- x * y 'quoted' \"double\"")
    for typed in (query[:n] for n in range(1, len(query) + 1)):  # as it is typed
        for hit in s.search(typed):
            assert hit.conversation.id == conv.id
    assert s.messages(conv.id)  # and nothing was changed
    s.close()


def test_punctuation_is_searched_as_it_is(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    conv = s.create_conversation("Arrows")
    m = s.add_message(conv.id, "user", "In JavaScript, what does => mean?")
    [hit] = s.search("=>")
    assert hit.message_id == m.id and hit.snippet == f"In JavaScript, what does {HIT_START}=>{HIT_END} mean?"
    assert s.search("<=") == []
    s.close()


def test_the_index_follows_edits_renames_and_deletes(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    conv = s.create_conversation("Plans")
    s.add_message(conv.id, "user", "Tell me about gardens")
    reply = s.add_message(conv.id, "assistant", "", STREAMING)
    s.update_message(reply.id, content="Tulips grow")  # written while it streams
    s.update_message(reply.id, content="Tulips grow in spring")
    assert [h.message_id for h in s.search("spring")] == [reply.id]
    s.update_message(reply.id, content="Roses")
    assert s.search("tulips") == [] and [h.message_id for h in s.search("roses")] == [reply.id]
    s.rename_conversation(conv.id, "Flowers")
    assert _titles(s, "flowers") == ["Flowers"] and s.search("plans") == []
    s.delete_messages_from(conv.id, reply.id)
    assert s.search("roses") == [] and _titles(s, "gardens") == ["Flowers"]
    s.delete_conversation(conv.id)  # its messages go by the foreign key's cascade
    assert s.search("gardens") == [] and s.search("flowers") == []
    assert s.db.execute("SELECT COUNT(*) FROM message_search WHERE message_search MATCH 'gardens'").fetchone()[0] == 0
    s.close()


def test_migration_indexes_the_messages_of_an_old_database(tmp_path: Path) -> None:
    path = tmp_path / "flashdesk.db"
    db = sqlite3.connect(path)
    for statement in MIGRATIONS[1]:
        db.execute(statement)
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('Old times', 1, 1)")
    db.execute(
        "INSERT INTO messages (conversation_id, role, content, created, updated) "
        "VALUES (1, 'user', 'A question about telescopes', 1, 1)"
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    s = Store(path)
    assert s.notice is None and s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    [hit] = s.search("telescope")
    assert hit.conversation.title == "Old times" and f"{HIT_START}telescopes{HIT_END}" in hit.snippet
    assert _titles(s, "old") == ["Old times"]
    s.close()


def test_without_fts5_search_uses_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(store_module.MIGRATIONS, 2, [])  # what a sqlite3 without FTS5 migrates to
    s = Store(tmp_path / "f.db")
    assert not s.fts
    conv = s.create_conversation("Rust")
    m = s.add_message(conv.id, "user", "What does the BORROW checker do? " + "More words here. " * 5)
    [hit] = s.search("borrow check")
    assert hit.message_id == m.id and hit.snippet.startswith(f"What does the {HIT_START}BORROW check{HIT_END}er")
    assert hit.snippet.endswith("…")
    assert _titles(s, "rus") == ["Rust"] and s.search("rust")[0].snippet == "" and s.search("%") == []
    s.close()


def _titles(s: Store, query: str) -> list[str]:
    return [h.conversation.title for h in s.search(query)]


# -- versions and branches (regenerate and edit keep what was there) ------------------------------------------


def _shown(s: Store, conversation_id: int) -> list[str]:
    return [m.content for m in s.messages(conversation_id)]


def test_regenerate_keeps_versions_each_with_what_followed_it(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    conv = s.create_conversation("Versions")
    question = s.add_message(conv.id, "user", "Name a colour")
    first = s.add_message(conv.id, "assistant", "Red")
    s.add_message(conv.id, "user", "Another?")
    s.add_message(conv.id, "assistant", "Blue")
    second = s.add_message(conv.id, "assistant", "Green", version_of=first.id)  # regenerate the first reply
    assert _shown(s, conv.id) == ["Name a colour", "Green"]
    third = s.add_message(conv.id, "assistant", "Yellow", version_of=second.id)
    shown = s.messages(conv.id)
    assert [m.content for m in shown] == ["Name a colour", "Yellow"]
    assert (shown[1].version, shown[1].versions) == (3, 3) and (shown[0].version, shown[0].versions) == (1, 1)
    assert (
        [v.content for v in s.versions(first.id)]
        == ["Red", "Green", "Yellow"]
        == [v.content for v in s.versions(third.id)]
    )

    s.choose_version(first.id)  # browse back: its branch, what followed it included, also after a restart
    s.close()
    s = Store(tmp_path / "f.db")
    shown = s.messages(conv.id)
    assert [m.content for m in shown] == ["Name a colour", "Red", "Another?", "Blue"]
    assert (shown[1].version, shown[1].versions) == (1, 3)
    s.add_message(conv.id, "user", "Why?")  # at the end of the branch shown
    assert _shown(s, conv.id) == ["Name a colour", "Red", "Another?", "Blue", "Why?"]
    s.choose_version(third.id)
    assert _shown(s, conv.id) == ["Name a colour", "Yellow"]

    # a refused new version is taken back: the version before it shows again
    refused = s.add_message(conv.id, "assistant", "", STREAMING, version_of=third.id)
    s.delete_messages_from(conv.id, refused.id)
    assert _shown(s, conv.id) == ["Name a colour", "Yellow"] and len(s.versions(first.id)) == 3
    s.delete_messages_from(conv.id, question.id)  # a message goes with everything after it, in every branch
    assert s.messages(conv.id) == [] and s.versions(first.id) == []
    assert s.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    s.close()


def test_editing_an_earlier_message_starts_a_branch_and_keeps_the_old_one(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    conv = s.create_conversation("Trip")
    s.add_message(conv.id, "user", "Plan a trip")
    s.add_message(conv.id, "assistant", "Where to?")
    asked = s.add_message(conv.id, "user", "Rome")
    s.add_message(conv.id, "assistant", "Rome: the Colosseum")
    s.add_message(conv.id, "user", "And food?")
    s.add_message(conv.id, "assistant", "Carbonara")
    edited = s.add_message(conv.id, "user", "Paris", version_of=asked.id)  # edit and resend "Rome"
    s.add_message(conv.id, "assistant", "Paris: the Louvre")
    shown = s.messages(conv.id)
    assert [m.content for m in shown] == ["Plan a trip", "Where to?", "Paris", "Paris: the Louvre"]
    assert (shown[2].version, shown[2].versions) == (2, 2) and [m.versions for m in shown[3:]] == [1]
    assert [v.content for v in s.versions(asked.id)] == ["Rome", "Paris"]

    s.choose_version(asked.id)  # the old branch, whole
    shown = s.messages(conv.id)
    assert [m.content for m in shown] == [
        "Plan a trip",
        "Where to?",
        "Rome",
        "Rome: the Colosseum",
        "And food?",
        "Carbonara",
    ]
    assert (shown[2].version, shown[2].versions) == (1, 2)
    s.choose_version(edited.id)
    assert _shown(s, conv.id)[2:] == ["Paris", "Paris: the Louvre"]

    first = s.messages(conv.id)[0]  # the first message has versions too
    s.add_message(conv.id, "user", "Plan a dinner", version_of=first.id)
    assert _shown(s, conv.id) == ["Plan a dinner"]
    s.choose_version(first.id)
    assert _shown(s, conv.id)[2:] == ["Paris", "Paris: the Louvre"]  # each branch as it was left
    s.delete_conversation(conv.id)
    assert s.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    s.close()


def test_a_refused_turn_takes_back_only_its_own_branch(tmp_path: Path) -> None:
    s = Store(tmp_path / "f.db")
    conv = s.create_conversation("Refused")
    question = s.add_message(conv.id, "user", "Question")
    s.add_message(conv.id, "assistant", "Answer")
    edit = s.add_message(conv.id, "user", "A much longer question", version_of=question.id)
    s.add_message(conv.id, "assistant", "", STREAMING)
    s.delete_messages_from(conv.id, edit.id)  # the engine refused the edited turn
    assert _shown(s, conv.id) == ["Question", "Answer"] and s.messages(conv.id)[0].versions == 1

    newer = s.add_message(conv.id, "user", "Other question", version_of=question.id)
    s.choose_version(question.id)
    s.delete_messages_from(conv.id, newer.id)  # a version not shown goes and changes nothing shown
    assert _shown(s, conv.id) == ["Question", "Answer"]
    newer = s.add_message(conv.id, "user", "Other question", version_of=question.id)
    s.choose_version(question.id)
    s.delete_messages_from(conv.id, question.id)  # the first version, shown: the one after it shows
    assert _shown(s, conv.id) == ["Other question"] and s.messages(conv.id)[0].id == newer.id
    s.close()


@pytest.mark.parametrize("fts", [True, False], ids=["fts5", "like"])
def test_search_reads_every_branch_and_a_hit_can_be_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fts: bool
) -> None:
    if not fts:
        monkeypatch.setitem(store_module.MIGRATIONS, 2, [])  # what a sqlite3 without FTS5 migrates to
    s = Store(tmp_path / "f.db")
    assert s.fts == fts
    conv = s.create_conversation("Animals")
    question = s.add_message(conv.id, "user", "Tell me about zebras")
    reply = s.add_message(conv.id, "assistant", "Zebras have stripes")
    s.add_message(conv.id, "user", "And the okapi?")
    hidden = s.add_message(conv.id, "assistant", "The okapi is a giraffe's cousin")
    s.add_message(conv.id, "assistant", "Zebras eat grass", version_of=reply.id)  # the okapi is in a branch set aside
    s.add_message(conv.id, "user", "Tell me about lions", version_of=question.id)

    [hit] = s.search("okapi")
    assert hit.message_id not in [m.id for m in s.messages(conv.id)] and f"{HIT_START}okapi{HIT_END}" in hit.snippet
    s.choose_branch(hidden.id)  # opening the hit: every message before it chosen, so it shows
    assert _shown(s, conv.id) == [
        "Tell me about zebras",
        "Zebras have stripes",
        "And the okapi?",
        "The okapi is a giraffe's cousin",
    ]
    # a word in the branch shown and in one set aside: the hit is the one shown, not the first written
    s.add_message(conv.id, "assistant", "Zebras are fast", version_of=reply.id)
    later = s.add_message(conv.id, "user", "More on zebras")
    [hit] = s.search("zebras")
    assert hit.message_id == question.id
    s.add_message(conv.id, "user", "Tell me about cats", version_of=question.id)
    [hit] = s.search("more on zebras")
    assert hit.message_id == later.id  # only in a branch set aside: found there

    # the shown version wins over an earlier one set aside, though the earlier was written first
    other = s.create_conversation("Stripes")
    s.add_message(other.id, "user", "Stripes?")
    first = s.add_message(other.id, "assistant", "Tapirs have stripes when young")
    second = s.add_message(other.id, "assistant", "Young tapirs have stripes", version_of=first.id)
    [hit] = s.search("tapirs")
    assert hit.message_id == second.id
    s.choose_version(first.id)
    [hit] = s.search("tapirs")
    assert hit.message_id == first.id
    s.close()


def _v3_database(path: Path) -> dict[str, int]:
    """A database as schema version 3 left it, by hand: regenerated replies are rows of one slot
    (the first version's id), the one shown not hidden; two conversations, their rows interleaved.
    The ids of its messages by content."""
    db = sqlite3.connect(path)
    for version in (1, 2, 3):
        for statement in MIGRATIONS[version]:
            db.execute(statement)
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('Colours', 1, 1), ('Plain', 1, 1)")
    rows = [  # (conversation, role, content, slot, hidden)
        (1, "user", "Name a colour", None, 0),
        (1, "assistant", "Red", 2, 1),
        (2, "user", "Hello", None, 0),
        (1, "assistant", "Green", 2, 0),  # regenerated: the second version shown
        (1, "user", "Why green?", None, 0),
        (2, "assistant", "Hi there", None, 0),
        (1, "assistant", "Grass", 7, 0),  # the first version shown again after a regenerate...
        (1, "assistant", "Leaves", 7, 1),
        (1, "user", "Thanks", None, 0),  # ...and the conversation went on after it
        (1, "assistant", "You are welcome", None, 0),
        (2, "user", "Bye", None, 0),
    ]
    ids = {}
    for conversation, role, content, slot, hidden in rows:
        cur = db.execute(
            "INSERT INTO messages (conversation_id, role, content, created, updated, slot, hidden) "
            "VALUES (?, ?, ?, 1, 1, ?, ?)",
            (conversation, role, content, slot, hidden),
        )
        ids[content] = cur.lastrowid
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    return ids


def test_migration_to_branches_keeps_what_version_3_showed_and_its_versions(tmp_path: Path) -> None:
    path = tmp_path / "flashdesk.db"
    ids = _v3_database(path)
    db = sqlite3.connect(path)
    shown_in_v3 = "SELECT content FROM messages WHERE conversation_id = ? AND hidden = 0 ORDER BY id"
    before = {c: [r[0] for r in db.execute(shown_in_v3, (c,))] for c in (1, 2)}
    db.close()
    s = Store(path)
    assert s.notice is None and s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert (
        _shown(s, 1)
        == before[1]
        == [
            "Name a colour",
            "Green",
            "Why green?",
            "Grass",
            "Thanks",
            "You are welcome",
        ]
    )
    assert _shown(s, 2) == before[2] == ["Hello", "Hi there", "Bye"]
    assert [v.content for v in s.versions(ids["Green"])] == ["Red", "Green"]
    assert [v.content for v in s.versions(ids["Leaves"])] == ["Grass", "Leaves"]
    assert [(m.version, m.versions) for m in s.messages(1)] == [(1, 1), (2, 2), (1, 1), (1, 2), (1, 1), (1, 1)]

    s.choose_version(ids["Red"])  # an earlier version of version 3 is a branch of its own, with nothing after it
    assert _shown(s, 1) == ["Name a colour", "Red"]
    s.choose_version(ids["Green"])
    s.choose_version(ids["Leaves"])
    assert _shown(s, 1) == ["Name a colour", "Green", "Why green?", "Leaves"]
    s.choose_version(ids["Grass"])
    assert _shown(s, 1) == before[1]
    [hit] = s.search("leaves")  # the index still knows every row
    assert hit.message_id == ids["Leaves"]
    s.close()
