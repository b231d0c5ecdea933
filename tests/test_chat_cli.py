"""`flashdesk chat`: the terminal chat and its --jsonl twin, on the tiny target + DFlash drafter.

Each turn re-renders the whole conversation; the engine reuses what the previous turns left in
its cache. The replies must be the ones a from-scratch prefill (--no-reuse) gives, token for token.
"""

import contextlib
import io
import json
import sys

import pytest

from flashdesk.engine.decode.chat_format import build_prompt_ids, load_tokenizer
from flashdesk.engine.cli.main import main

SYSTEM = "Be brief."
TURNS = [
    "Hello there, what is the answer?",
    "And what about the world?",
    "Tell me more about the model.",
    "Thanks, that is it for this thing.",
]


def chat(argv, requests, jsonl=True):
    """Run `flashdesk chat` with `requests` on stdin (dicts as JSON lines, strings as they are)."""
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests)
    out, err, old = io.StringIO(), io.StringIO(), sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["chat", *map(str, argv), *(["--jsonl"] if jsonl else [])])
    finally:
        sys.stdin = old
    return rc, out.getvalue(), err.getvalue()


def jsonl(argv, requests) -> list[dict]:
    rc, out, err = chat(argv, requests)
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]  # nothing but JSON lines on stdout


@pytest.fixture(scope="module")
def folders(spec_pair):
    _, (target_dir, draft_dir), _, _ = spec_pair
    return target_dir, draft_dir


@pytest.fixture(scope="module")
def tokenizer(folders):
    return load_tokenizer(folders[0])


@pytest.fixture(scope="module")
def four_turns(folders):
    """The 4-turn session with a regenerate after turn 2, with prefix reuse and without."""
    target_dir, draft_dir = folders
    script = [
        {"user": TURNS[0]},
        {"user": TURNS[1]},
        {"command": "regenerate"},
        {"user": TURNS[2]},
        {"user": TURNS[3]},
        {"command": "stats"},
    ]
    args = ["--model", target_dir, "--draft", draft_dir, "--system", SYSTEM, "--max-new-tokens", 16, "--device", "cpu"]
    return jsonl(args, script), jsonl([*args, "--no-reuse"], script)


def test_reuse_gives_the_same_replies_as_prefilling_from_scratch(four_turns):
    reuse, scratch = four_turns
    assert len(reuse) == len(scratch) == 6
    for a, b in zip(reuse[:5], scratch[:5]):
        assert a["prompt_ids"] == b["prompt_ids"]
        assert a["token_ids"] == b["token_ids"] and len(a["token_ids"]) > 0
        assert a["text"] == b["text"] and a["finish_reason"] == b["finish_reason"]
        assert a["dropped_messages"] == 0
    assert any(step["draft"] for reply in reuse[:5] for step in reply["steps"])  # DFlash really drafted
    regenerated = reuse[2]
    assert regenerated["regenerated"] is True and "regenerated" not in reuse[1]
    assert regenerated["prompt_ids"] == reuse[1]["prompt_ids"]
    assert regenerated["token_ids"] == reuse[1]["token_ids"]  # greedy: the same reply again


def test_reuse_prefills_only_each_turns_new_tokens(four_turns, tokenizer):
    reuse, scratch = four_turns
    replies, users = reuse[:5], [TURNS[0], TURNS[1], None, TURNS[2], TURNS[3]]
    for i, reply in enumerate(replies):
        stats, n = reply["stats"], len(reply["prompt_ids"])
        assert stats["prompt_tokens"] == n
        assert stats["reused_tokens"] + stats["prefill_tokens"] == n
        if i == 0:
            assert stats["reused_tokens"] == 0
            continue
        assert stats["reused_tokens"] > 0, f"turn {i}: nothing reused"
        previous = replies[i - 1]["prompt_ids"]
        common = next((j for j, (a, b) in enumerate(zip(previous, reply["prompt_ids"])) if a != b), len(previous))
        # at most what the previous prompt does not share (the prompt's last token always runs)
        assert stats["prefill_tokens"] <= max(1, n - common), (i, stats, common)
        if users[i] is None:  # the regenerate: the prompt is the previous one, all of it cached
            assert reply["prompt_ids"] == previous and stats["prefill_tokens"] == 1
        else:  # the new message, the last answer as the template re-renders it, and the turn markers
            answer = replies[i - 1]["text"]
            new = len(tokenizer.encode(users[i] + answer, add_special_tokens=False))
            assert stats["prefill_tokens"] < new + 16, (i, stats["prefill_tokens"], new)
            if i >= 3:  # a conversation of some length: most of it comes from the cache
                assert stats["prefill_tokens"] < n / 2
    for reply in scratch[:5]:
        assert reply["stats"]["reused_tokens"] == 0
        assert reply["stats"]["prefill_tokens"] == len(reply["prompt_ids"])
    totals = reuse[5]
    assert totals["command"] == "stats" and totals["ok"] is True and totals["turns"] == 5
    assert totals["reused_tokens"] == sum(r["stats"]["reused_tokens"] for r in replies)
    assert totals["prefill_tokens"] == sum(r["stats"]["prefill_tokens"] for r in replies)
    assert totals["generated_tokens"] == sum(len(r["token_ids"]) for r in replies)
    assert totals["last"]["generated_tokens"] == len(replies[-1]["token_ids"])


def test_history_keeps_the_answers_and_drops_the_replaced_reply(four_turns, tokenizer):
    reuse, _ = four_turns
    messages = [{"role": "system", "content": SYSTEM}]
    for user, reply in [(TURNS[0], reuse[0]), (TURNS[1], reuse[2]), (TURNS[2], reuse[3])]:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply["text"]}]
    expected = build_prompt_ids(tokenizer, messages + [{"role": "user", "content": TURNS[3]}], enable_thinking=False)
    assert reuse[4]["prompt_ids"] == expected


def _system_prefix(tokenizer) -> list[int]:
    a = build_prompt_ids(
        tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x"}], enable_thinking=False
    )
    b = build_prompt_ids(
        tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "yy z"}], enable_thinking=False
    )
    n = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    return a[: n - 1]  # up to the system turn's end


LONG = [
    "Hello there, what is the answer to the question of the world and the model?",
    "I think that the answer is not in the model, and you have to think with the user.",
    "What can the speculative model help with in this world, and what is it not for?",
    "Let the user have the answer, and the model the thought, on the world at the end.",
    "The naïve café is in the world; what is the answer for the user of this model?",
    "Is it the model that can think, or the user that has the answer for the world?",
]


def test_past_the_context_limit_drop_oldest_carries_on(folders, tmp_path, tokenizer):
    target_dir, draft_dir = folders
    args = [
        "--model",
        target_dir,
        "--draft",
        draft_dir,
        "--system",
        SYSTEM,
        "--context",
        160,
        "--max-new-tokens",
        24,
        "--ignore-eos",
        "--device",
        "cpu",
    ]
    script = [{"user": text} for text in LONG] + [{"command": "save", "value": str(tmp_path / "c.json")}]
    out = jsonl(args, script)
    scratch = jsonl([*args, "--no-reuse"], script)
    replies = out[:-1]
    assert all("error" not in r for r in out), out
    assert len(replies) == len(LONG) and all(len(r["token_ids"]) > 0 for r in replies)
    assert any(r["dropped_messages"] > 0 for r in replies)
    prefix = _system_prefix(tokenizer)
    for reply, again in zip(replies, scratch):
        assert reply["prompt_ids"][: len(prefix)] == prefix  # the system prompt survives the drops
        assert len(reply["prompt_ids"]) + len(reply["token_ids"]) <= 160
        assert reply["token_ids"] == again["token_ids"]
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["messages"][0] == {"role": "system", "content": SYSTEM}
    assert saved["messages"][-1] == {"role": "assistant", "content": replies[-1]["text"]}
    assert len(saved["messages"]) < 1 + 2 * len(LONG)  # the history lost the dropped turns too
    assert saved["settings"]["context_policy"] == "drop_oldest" and saved["settings"]["context_limit"] == 160


def test_past_the_context_limit_stop_says_so_and_the_session_goes_on(folders):
    target_dir, _ = folders
    args = [
        "--model",
        target_dir,
        "--system",
        SYSTEM,
        "--context",
        160,
        "--max-new-tokens",
        24,
        "--ignore-eos",
        "--device",
        "cpu",
        "--context-policy",
        "stop",
    ]
    out = jsonl(args, [{"user": text} for text in LONG] + [{"command": "clear"}, {"user": LONG[0]}])
    assert len(out) == len(LONG) + 2
    errors = [i for i, r in enumerate(out[: len(LONG)]) if "error" in r]
    assert errors and errors[0] > 0 and errors == list(range(errors[0], len(LONG)))  # full stays full
    assert "context" in out[errors[0]]["error"] and "/clear" in out[errors[0]]["error"]
    assert out[len(LONG)] == {"command": "clear", "ok": True, "system": SYSTEM}
    again = out[-1]
    assert "error" not in again and again["token_ids"] == out[0]["token_ids"]  # a fresh start, greedy
    assert again["prompt_ids"] == out[0]["prompt_ids"]


def test_jsonl_commands_and_bad_lines(folders, tmp_path):
    target_dir, draft_dir = folders
    args = ["--model", target_dir, "--draft", draft_dir, "--max-new-tokens", 12, "--ignore-eos", "--device", "cpu"]
    out = jsonl(
        args,
        [
            "this is not json",
            {"command": "warp"},
            {"user": 3},
            {"command": "k", "value": 99},
            {"command": "regenerate"},  # nothing to regenerate yet
            {"command": "k 4"},
            {"user": "Hello there"},
            {"command": "spec", "value": "off"},
            {"user": "And the world?"},
            {"command": "spec", "value": True},
            {"command": "think", "value": "on"},
            {"command": "system", "value": SYSTEM},
            {"user": "What is the answer?"},
            {"command": "system"},
            {"command": "think", "value": "maybe"},
            {"command": "save", "value": str(tmp_path / "s.json")},
            {"command": "bye"},
            {"user": "never read"},
        ],
    )
    assert set(out[0]) == set(out[2]) == {"error"} and "not JSON" in out[0]["error"]
    assert out[1] == {"command": "warp", "error": "unknown command /warp: /help lists the commands"}
    assert out[3]["command"] == "k" and "1..15" in out[3]["error"]
    assert "nothing to regenerate" in out[4]["error"]
    assert out[5] == {"command": "k", "ok": True, "draft_length": 4, "speculation": True}
    drafted = [len(s["draft"]) for s in out[6]["steps"]]
    assert drafted and all(1 <= d <= 4 for d in drafted)
    assert out[7]["speculation"] is False
    assert out[8]["steps"] and all(s["draft"] == [] for s in out[8]["steps"])
    assert out[8]["stats"]["mean_acceptance_length"] is None
    assert out[9]["speculation"] is True and out[10] == {"command": "think", "ok": True, "thinking": True}
    assert out[11] == {"command": "system", "ok": True, "system": SYSTEM}
    assert 98 in out[12]["prompt_ids"]  # <|think|>
    assert out[13] == {"command": "system", "ok": True, "system": None}
    assert "on or off" in out[14]["error"]
    saved = json.loads((tmp_path / "s.json").read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"] * 3  # the system prompt cleared
    assert saved["settings"]["thinking"] is True and saved["settings"]["draft_length"] == 4
    assert out[16] == {"command": "bye", "ok": True} and len(out) == 17


def test_commands_that_need_a_drafter_say_so(folders):
    target_dir, _ = folders
    out = jsonl(
        ["--model", target_dir, "--max-new-tokens", 4, "--device", "cpu"],
        [{"command": "spec", "value": "on"}, {"command": "k", "value": 3}, {"user": "Hello"}],
    )
    assert "--draft" in out[0]["error"] and "--draft" in out[1]["error"]
    assert out[2]["steps"] is not None and out[2]["stats"]["mean_acceptance_length"] is None


def test_interactive_streams_replies_and_runs_commands(folders, tmp_path):
    target_dir, draft_dir = folders
    path = tmp_path / "chat.json"
    rc, out, err = chat(
        ["--model", target_dir, "--draft", draft_dir, "--max-new-tokens", 12, "--ignore-eos", "--device", "cpu"],
        [
            "/k 99",
            "/k 4",
            "/bogus",
            "Hello there",
            "/spec off",
            "What is the answer?",
            "/think maybe",
            f"/save {path}",
            "/stats",
            "/bye",
            "never read",
        ],
        jsonl=False,
    )
    assert rc == 0, err
    assert "error: /k takes a draft length 1..15 or auto, got '99'" in err
    assert "draft length 4" in err and "error: unknown command /bogus" in err
    assert "speculation off" in err and "error: /think takes on or off" in err
    stats_lines = [line for line in err.splitlines() if line.startswith("[ttft")]
    assert len(stats_lines) == 2
    assert "tau -" not in stats_lines[0] and "tau -" in stats_lines[1]  # spec on, then off
    assert all("reused" in line and "prefilled" in line and "finish: length" in line for line in stats_lines)
    saved = json.loads(path.read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"] * 2
    assert saved["messages"][0]["content"] == "Hello there"
    assert out == "".join(m["content"] + "\n" for m in saved["messages"][1::2])  # only answers on stdout
    assert saved["settings"]["speculation"] is False and saved["settings"]["draft_length"] == 4
    assert "turns 2" in err and "last turn: 12 tokens" in err


def test_interactive_ctrl_c_cancels_a_reply_and_a_full_context_drops_turns(folders, monkeypatch):
    from flashdesk.engine.cli import chat as chat_cli

    step, calls = chat_cli._Stream.step, []

    def ctrl_c_in_the_first_reply(self, event):
        calls.append(event.index)
        if calls.count(0) == 1 and event.index == 2:
            raise KeyboardInterrupt
        step(self, event)

    monkeypatch.setattr(chat_cli._Stream, "step", ctrl_c_in_the_first_reply)
    target_dir, _ = folders
    rc, out, err = chat(
        [
            "--model",
            target_dir,
            "--system",
            SYSTEM,
            "--context",
            160,
            "--max-new-tokens",
            24,
            "--ignore-eos",
            "--device",
            "cpu",
        ],
        [LONG[0], "/regenerate", *LONG, "/stats"],
        jsonl=False,
    )
    assert rc == 0, err
    assert "[cancelled: the message and its partial reply are left out of the history]" in err
    assert "error: nothing to regenerate" in err  # the cancelled message went with its reply
    assert len([line for line in err.splitlines() if line.startswith("[ttft")]) == len(LONG)
    assert "[context full: dropped the 2 oldest message(s), the system prompt kept]" in err
    assert f"turns {len(LONG)} (cancelled 1)" in err


def test_a_cancelled_reply_leaves_the_history_and_the_cache_usable(folders):
    from flashdesk.engine.decode.generation import Engine
    from flashdesk.engine.decode.sampling import SamplingParams
    from flashdesk.engine.decode.speculative import SpecControl
    from flashdesk.engine.cli.chat import ChatSession

    target_dir, draft_dir = folders
    engine = Engine.load(target_dir, device="cpu", draft_dir=draft_dir)

    def session(reuse):
        return ChatSession(
            engine,
            SpecControl(),
            system=SYSTEM,
            thinking=False,
            sampling=SamplingParams(),
            max_new_tokens=12,
            ignore_eos=True,
            stop_strings=(),
            reuse=reuse,
            policy="drop_oldest",
        )

    def interrupt(event):
        if event.index == 2:
            raise KeyboardInterrupt

    live = session(True)
    live.send(TURNS[0])
    before = list(live.history)
    with pytest.raises(KeyboardInterrupt):
        live.send(TURNS[1], on_step=interrupt)
    assert live.history == before and live.totals.cancelled == 1 and live.totals.turns == 1
    after = live.send(TURNS[1])
    fresh = session(False)
    fresh.send(TURNS[0])
    expected = fresh.send(TURNS[1])
    assert after.token_ids == expected.token_ids and after.prompt_ids == expected.prompt_ids


def test_bad_flags_exit_2(folders, capsys):
    target_dir, _ = folders
    assert main(["chat", "--model", str(target_dir), "--draft-length", "3"]) == 2
    assert "flashdesk chat: error: --draft-length, --method and --no-speculate need --draft" in capsys.readouterr().err
    assert main(["chat", "--model", str(target_dir), "--max-new-tokens", "0"]) == 2
    assert "flashdesk chat: error: --max-new-tokens must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["chat", "--model", str(target_dir), "--context-policy", "later"])
    assert exc.value.code == 2


def test_the_method_command_switches_between_loaded_draft_models(spec_pair, tmp_path):
    """`chat --draft DFLASH --assistant MTP`: /method mtp drafts with the assistant, /method auto picks,
    a method whose draft model is not loaded is refused by name."""
    from tiny_assistant import write_echo_assistant

    target_dir, draft_dir = spec_pair[1]
    assistant = tmp_path / "assistant"
    write_echo_assistant(assistant, spec_pair[2], seed=4)
    base = ["--model", target_dir, "--max-new-tokens", 6, "--device", "cpu"]
    out = jsonl(
        [*base, "--draft", draft_dir, "--assistant", assistant],
        [{"command": "method", "value": "mtp"}, {"user": "Hello"}, {"command": "method", "value": "auto"}],
    )
    assert out[0] == {"command": "method", "ok": True, "method": "mtp", "speculation": True}
    assert {s.get("method") for s in out[1]["steps"] if s.get("draft")} <= {"mtp"}
    assert out[2]["method"] == "auto"
    alone = jsonl([*base, "--draft", assistant], [{"command": "method", "value": "dflash"}])
    assert "/method takes one of mtp (the loaded draft models), got 'dflash'" in alone[0]["error"]
