"""The worker protocol and the engine process, driven as the app drives them, with the demo model."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flashdesk import paths
from flashdesk import protocol as p

ROOT = Path(__file__).resolve().parents[1]


# -- the protocol --------------------------------------------------------------------------------------


def test_messages_round_trip() -> None:
    msgs = [
        p.Load("/m", "/d", "cpu", "auto", "fp8", 4096),
        p.Generate("r1", [{"role": "user", "content": "héllo"}], 0.7, 0.9, 40, 3, 128, True),
        p.Cancel("r1"),
        p.SetSpeculation(False, 4),
        p.Shutdown(),
        p.Step(
            "r1",
            2,
            [5, 6],
            [5, 9],
            1,
            "ab",
            "",
            [[1, p.DRAFT], [1, p.TARGET]],
            0.1,
            0.02,
            0.08,
            0.5,
            {"mean_acceptance_length": 2.0},
        ),
        p.Error(p.OUT_OF_MEMORY, "CUDA out of memory", "generate", "r1"),
    ]
    for msg in msgs:
        line = p.encode(msg)
        assert "\n" not in line
        assert p.decode(line) == msg


def test_decode_tolerates_new_fields_and_refuses_garbage() -> None:
    assert p.decode('{"type": "cancel", "request_id": "x", "added_later": 1}') == p.Cancel("x")
    assert p.decode('{"type": "set_speculation", "enabled": true}') == p.SetSpeculation(True, None)
    for bad in ('{"type": "cancel"}', '{"type": "nope"}', "not json", "[1, 2]"):
        with pytest.raises(p.ProtocolError):
            p.decode(bad)


def test_protocol_imports_no_torch_and_no_qt(tmp_path: Path) -> None:
    code = (
        "import sys, flashdesk.protocol;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'PySide6', 'flashdesk.engine')"
        " or m.startswith(('flashdesk.engine', 'flashdesk.app'))];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# -- the demo model -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, Path]:
    from flashdesk.engine.hub.demo import create_demo

    return create_demo(tmp_path_factory.mktemp("demo"))


def test_demo_model_is_a_complete_checkpoint_pair(demo, tmp_path: Path) -> None:
    from flashdesk.engine.loading.checkpoint import inspect_checkpoint
    from flashdesk.engine.hub.demo import create_demo, is_complete

    target, drafter = demo
    report = inspect_checkpoint(target, 4096)
    assert report.ok, report.problems
    assert is_complete(target.parent)
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert create_demo(target.parent) == (target, drafter)  # already there: left alone
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    # deterministic: a second folder holds the same bytes
    again, _ = create_demo(tmp_path / "again")
    assert (again / "model.safetensors").read_bytes() == (target / "model.safetensors").read_bytes()


def test_demo_drafter_is_accepted(demo) -> None:
    """The demo's drafter was trained against its target (DFlash's recipe), so its drafts are
    accepted, and the output is the same as without speculation."""
    from flashdesk.engine.decode.chat_format import build_prompt_ids
    from flashdesk.engine.decode.generation import Engine, GenerationRequest
    from flashdesk.engine.decode.speculative import SpecControl

    target, drafter = demo
    engine = Engine.load(target, device="cpu", draft_dir=drafter)
    ids = build_prompt_ids(engine.tokenizer, HELLO, enable_thinking=False)
    request = GenerationRequest(ids, max_new_tokens=80, ignore_eos=True)
    off = list(engine.generate(request, SpecControl(enabled=False)))[-1]
    on = list(engine.generate(request, SpecControl(enabled=True, draft_length=6)))[-1]
    assert on.token_ids == off.token_ids
    assert on.stats["accepted"] > 0 and on.stats["mean_acceptance_length"] > 1.5


# -- the worker process -------------------------------------------------------------------------------


class WorkerProcess:
    """`python -m flashdesk.engine.worker` with a reader thread, so reads can time out."""

    def __init__(self, **env: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flashdesk.engine.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(p.decode(line))
        self.events.put(None)

    def send(self, msg) -> None:
        self.proc.stdin.write(p.encode(msg) + "\n")
        self.proc.stdin.flush()

    def next(self, timeout: float = 60):
        msg = self.events.get(timeout=timeout)
        assert msg is not None, f"the worker ended: {self.proc.stderr.read()}"
        return msg

    def until(self, kinds, timeout: float = 60) -> list:
        seen = []
        while True:
            msg = self.next(timeout)
            seen.append(msg)
            if isinstance(msg, kinds):
                return seen

    def close(self) -> int:
        if self.proc.poll() is None:
            self.send(p.Shutdown())
        try:
            return self.proc.wait(timeout=20)
        finally:
            self.proc.stdin.close()


@pytest.fixture
def worker():
    w = WorkerProcess()
    assert isinstance(w.next(), p.Ready)
    yield w
    w.close()


def _load(w: WorkerProcess, demo) -> p.Loaded:
    w.send(p.Load(str(demo[0]), str(demo[1]), device="cpu"))
    seen = w.until((p.Loaded, p.Error))
    assert isinstance(seen[-1], p.Loaded), seen[-1]
    assert any(isinstance(m, p.LoadProgress) for m in seen)
    return seen[-1]


HELLO = [{"role": "user", "content": "Hello"}]


def test_inspect_load_generate(worker: WorkerProcess, demo) -> None:
    worker.send(p.Inspect(str(demo[0]), str(demo[1]), 4096))
    plan = worker.next()
    assert isinstance(plan, p.Inspected) and plan.ok and plan.memory_bytes > 0
    assert any(line.startswith("memory") for line in plan.lines)
    assert any(line.startswith("drafter") and "block 16" in line for line in plan.lines)
    assert any("drafter context" in line for line in plan.lines)  # the plan includes the drafter

    info = _load(worker, demo)
    assert info.block_size == 16 and info.device == "cpu" and info.context_limit == 4096
    last = json.loads((paths.data_dir() / "last_load.json").read_text())  # for doctor --report
    assert last["device"] == "cpu" and last["context_limit"] == 4096 and last["drafter"]
    assert info.sampling_defaults == {"temperature": 0.0}  # the demo's generation_config: greedy

    worker.send(p.Generate("a", HELLO, temperature=0.0, max_tokens=40, ignore_eos=True))  # 40 tokens, whatever it says
    seen = worker.until(p.Finished)
    started, steps, done = seen[0], [m for m in seen if isinstance(m, p.Step)], seen[-1]
    assert isinstance(started, p.Started) and started.prompt_tokens > 5
    assert steps[0].index == 0 and steps[0].stats is None
    assert done.reason == "length" and len(done.token_ids) == 40
    assert [t for s in steps for t in s.emitted] == done.token_ids
    assert "".join(s.answer for s in steps) == done.text
    for s in steps:  # the origin spans cover each step's answer text exactly
        assert sum(n for n, _ in s.spans) == len(s.answer)
    assert any(origin == p.DRAFT for s in steps for _, origin in s.spans)
    assert done.stats["mean_acceptance_length"] == steps[-1].stats["mean_acceptance_length"]

    # the same as the engine's own generate, token for token
    from flashdesk.engine.decode.chat_format import build_prompt_ids
    from flashdesk.engine.decode.generation import Engine, GenerationRequest

    engine = Engine.load(demo[0], device="cpu")
    ids = build_prompt_ids(engine.tokenizer, HELLO, enable_thinking=False)
    reference = list(engine.generate(GenerationRequest(ids, 40, ignore_eos=True)))[-1]
    assert reference.token_ids == done.token_ids and reference.text == done.text


def test_cancel_stops_within_one_step(demo) -> None:
    w = WorkerProcess(FLASHDESK_WORKER_STEP_DELAY="0.02")
    try:
        assert isinstance(w.next(), p.Ready)
        _load(w, demo)
        w.send(p.SetSpeculation(False, None))
        w.send(p.Generate("c", HELLO, max_tokens=2000, ignore_eos=True))
        count = 0
        while True:
            msg = w.next()
            if isinstance(msg, p.Step):
                count += 1
                if count == 5:
                    w.send(p.Cancel("c"))
            if isinstance(msg, p.Finished):
                break
        assert msg.reason == "cancelled"
        assert msg.cancel_step is not None and msg.last_step <= msg.cancel_step
        assert msg.last_step <= 6 and len(msg.token_ids) == msg.last_step + 1
        # a cancel for a request that is not running is harmless
        w.send(p.Cancel("nothing"))
        w.send(p.Generate("d", HELLO, temperature=0.0, max_tokens=3))
        assert w.until(p.Finished)[-1].reason == "length"
    finally:
        assert w.close() == 0


def test_speculation_changes_apply_mid_generation_and_change_nothing(demo) -> None:
    w = WorkerProcess(FLASHDESK_WORKER_STEP_DELAY="0.01")
    try:
        assert isinstance(w.next(), p.Ready)
        _load(w, demo)
        w.send(p.SetSpeculation(False, None))
        w.send(p.Generate("off", HELLO, temperature=0.0, max_tokens=90, ignore_eos=True))
        plain = w.until(p.Finished)[-1]

        plan = {3: p.SetSpeculation(True, 2), 10: p.SetSpeculation(False, 2), 16: p.SetSpeculation(True, 5)}
        w.send(p.SetSpeculation(True, 3))
        w.send(p.Generate("on", HELLO, temperature=0.0, max_tokens=90, ignore_eos=True))
        lengths = []
        while True:
            msg = w.next()
            if isinstance(msg, p.Step) and msg.index > 0:
                lengths.append(len(msg.draft))
                if msg.index in plan:
                    w.send(plan[msg.index])
            if isinstance(msg, p.Finished):
                break
        assert msg.token_ids == plain.token_ids and msg.text == plain.text
        # each change shows from a later step on, in the order sent
        seq = [n for i, n in enumerate(lengths) if i == 0 or n != lengths[i - 1]]
        assert seq[:4] == [3, 2, 0, 5], lengths

        w.send(p.SetSpeculation(True, p.AUTO_DRAFT_LENGTH))  # the engine picks each step's length
        w.send(p.Generate("auto", HELLO, temperature=0.0, max_tokens=90, ignore_eos=True))
        auto = w.until(p.Finished)
        assert auto[-1].token_ids == plain.token_ids
        assert {len(m.draft) for m in auto if isinstance(m, p.Step) and m.index > 0} <= set(range(16))
    finally:
        w.close()


def test_errors_are_events_with_a_kind(worker: WorkerProcess, tmp_path: Path) -> None:
    worker.send(p.Generate("x", HELLO))
    err = worker.next()
    assert isinstance(err, p.Error) and err.kind == p.BAD_INPUT and "no model is loaded" in err.message
    assert err.request_id == "x" and err.during == "generate"
    worker.send(p.Load(str(tmp_path / "missing")))
    seen = worker.until(p.Error)
    assert seen[-1].kind == p.BAD_INPUT and "missing" in seen[-1].message and seen[-1].during == "load"
    logged = [json.loads(line) for line in (paths.data_dir() / "errors.jsonl").read_text().splitlines()]
    assert {"kind": p.BAD_INPUT, "during": "load"}.items() <= logged[-1].items()  # for doctor --report
    assert "missing" in logged[-1]["message"]
    worker.proc.stdin.write("this is not a message\n")
    worker.proc.stdin.flush()
    assert worker.next().kind == p.BAD_INPUT
    worker.send(p.Inspect(str(tmp_path)))
    plan = worker.next()
    assert isinstance(plan, p.Inspected) and not plan.ok


def test_error_kinds() -> None:
    from flashdesk.engine.errors import CheckpointError
    from flashdesk.engine.worker import error_kind

    class OutOfMemoryError(RuntimeError):
        pass

    assert error_kind(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == p.OUT_OF_MEMORY
    assert error_kind(MemoryError()) == p.OUT_OF_MEMORY
    assert error_kind(CheckpointError("missing tensor")) == p.BAD_INPUT
    assert error_kind(ValueError("temperature must be >= 0")) == p.BAD_INPUT
    assert error_kind(RuntimeError("CUDA error: an illegal memory access")) == p.CRASH


def test_end_of_input_stops_the_worker(demo) -> None:
    w = WorkerProcess()
    assert isinstance(w.next(), p.Ready)
    w.proc.stdin.close()
    assert w.proc.wait(timeout=20) == 0


def test_stray_prints_do_not_reach_the_protocol() -> None:
    """Once the worker holds the protocol stream, print() (from any library) goes to stderr."""
    code = (
        "from flashdesk.engine import worker\n"
        "out = worker._protocol_stream()\n"
        "print('stray text from a library')\n"
        'out.write(\'{"type": "unloaded"}\\n\'); out.flush()\n'
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == '{"type": "unloaded"}\n'
    assert "stray text" in proc.stderr


# -- the context: prefix reuse, token counts, a conversation past the context ---------------------------


def _turn(w: WorkerProcess, rid: str, messages: list[dict], **kw) -> tuple[p.Started, p.Finished]:
    w.send(p.Generate(rid, messages, temperature=0.0, **kw))
    seen = w.until((p.Finished, p.Error))
    assert isinstance(seen[-1], p.Finished), seen[-1]
    started = next(m for m in seen if isinstance(m, p.Started))
    return started, seen[-1]


def _count(w: WorkerProcess, rid: str, messages: list[dict], thinking: bool = False) -> p.TokenCount:
    w.send(p.CountTokens(rid, messages, thinking))
    counted = w.until(p.TokenCount)[-1]
    assert counted.request_id == rid
    return counted


def test_follow_ups_reuse_the_prefix_and_token_counts(worker: WorkerProcess, demo) -> None:
    from flashdesk.engine.decode.chat_format import build_prompt_ids
    from flashdesk.engine.decode.chat_format import load_tokenizer

    assert _count(worker, "none", HELLO).tokens == -1  # no model: the gauge shows nothing
    info = _load(worker, demo)
    tokenizer = load_tokenizer(demo[0])
    counted = _count(worker, "c1", HELLO)
    assert counted.tokens == len(build_prompt_ids(tokenizer, HELLO, enable_thinking=False))
    assert counted.context_limit == info.context_limit == 4096
    assert _count(worker, "c2", HELLO, thinking=True).tokens >= counted.tokens

    first, done = _turn(worker, "t1", HELLO, max_tokens=12)
    assert (first.prompt_tokens, first.reused_tokens, first.dropped_messages, first.max_tokens) == (
        counted.tokens,
        0,
        0,
        12,
    )
    for key in (
        "reused_tokens",
        "prefill_tokens",
        "kernels",
        "cuda_graphs",
        "prompt_tokens",
        "prefill_seconds",
        "mean_acceptance_length",
    ):
        assert key in done.stats, key
    assert done.stats["reused_tokens"] == 0 and done.stats["prefill_tokens"] == first.prompt_tokens

    talk = HELLO + [
        {"role": "assistant", "content": done.text or "ok"},
        {"role": "user", "content": "And then what happened next in the story?"},
    ]
    second, done2 = _turn(worker, "t2", talk, max_tokens=12)
    assert second.prompt_tokens > first.prompt_tokens
    assert 0 < second.reused_tokens < second.prompt_tokens
    ids1, ids2 = (build_prompt_ids(tokenizer, m, enable_thinking=False) for m in (HELLO, talk))
    shared = next(i for i, (a, b) in enumerate(zip(ids1, ids2)) if a != b)  # up to the empty thought channel
    assert second.reused_tokens >= shared > 0
    assert done2.stats["reused_tokens"] == second.reused_tokens
    assert done2.stats["prefill_tokens"] == second.prompt_tokens - second.reused_tokens

    # reuse off: the same prompt prefilled from scratch, the same greedy reply
    third, done3 = _turn(worker, "t3", talk, max_tokens=12, reuse=False)
    assert third.reused_tokens == 0 and done3.stats["prefill_tokens"] == third.prompt_tokens
    assert done3.token_ids == done2.token_ids


def test_token_counts_are_answered_during_a_generation(demo) -> None:
    w = WorkerProcess(FLASHDESK_WORKER_STEP_DELAY="0.05")
    try:
        assert isinstance(w.next(), p.Ready)
        _load(w, demo)
        w.send(p.Generate("long", HELLO, max_tokens=200, ignore_eos=True))
        w.until(p.Step)
        w.send(p.CountTokens("mid", HELLO))
        seen = w.until((p.TokenCount, p.Finished))
        assert isinstance(seen[-1], p.TokenCount) and seen[-1].tokens > 0  # not behind the reply
        w.send(p.Cancel("long"))
        assert w.until(p.Finished)[-1].reason == "cancelled"
    finally:
        w.close()


def _long_talk(turns: int) -> list[dict]:
    talk = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        talk += [
            {"role": "user", "content": f"Question {i}: " + "tell me about the weather at sea. " * 6},
            {"role": "assistant", "content": f"Answer {i}: " + "calm and grey. " * 6},
        ]
    return talk + [{"role": "user", "content": "And tomorrow?"}]


def test_a_conversation_past_a_small_context(worker: WorkerProcess, demo) -> None:
    worker.send(p.Load(str(demo[0]), str(demo[1]), device="cpu", context=320))
    info = worker.until((p.Loaded, p.Error))[-1]
    assert isinstance(info, p.Loaded) and info.context_limit == 320
    talk = _long_talk(8)
    assert _count(worker, "n", talk).tokens > 320

    # the default policy: the oldest turns go, the system prompt stays, the reply gets its room
    started, done = _turn(worker, "drop", talk, max_tokens=40)
    assert started.dropped_messages >= 2 and started.dropped_messages % 2 == 0
    assert started.prompt_tokens <= 320 - 40 and started.max_tokens == 40
    assert done.reason in ("stop", "length") and done.stats["dropped_messages"] == started.dropped_messages
    kept = talk[:1] + talk[1 + started.dropped_messages :]
    assert _count(worker, "k", kept).tokens == started.prompt_tokens

    # stop: refused with a clear message, as bad input, before anything started
    worker.send(p.Generate("stop", talk, max_tokens=40, context_policy="stop"))
    err = worker.until((p.Error, p.Started))[-1]
    assert isinstance(err, p.Error) and err.kind == p.BAD_INPUT and err.during == "generate"
    assert err.request_id == "stop" and "context" in err.message and "new conversation" in err.message
    worker.send(p.Generate("bad", HELLO, context_policy="sideways"))
    assert worker.until(p.Error)[-1].kind == p.BAD_INPUT

    # a reply that runs into the end of the context says so
    started, done = _turn(worker, "full", HELLO, max_tokens=1000, ignore_eos=True)
    assert started.max_tokens == 320 - started.prompt_tokens and started.dropped_messages == 0
    assert done.reason == "context" and len(done.token_ids) == started.max_tokens
    started, done = _turn(worker, "short", HELLO, max_tokens=5, ignore_eos=True)
    assert done.reason == "length" and started.max_tokens == 5
