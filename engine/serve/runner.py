"""The engine's queue for HTTP chat jobs: one at a time, in arrival order, cancellable between steps.

Why one at a time: the engine holds one KV cache and one prefix cache (the conversation it last
ran), so requests take turns; that is also what lets a follow-up turn reuse the prefix of the
request before it. The HTTP side never touches the engine or its tokenizer: it submits a Job (its
prompt already tokenized, prompt.py, and the prefix-cache scope of its API key) and reads the job's
events from its sink, which the engine thread calls.

Where jobs run: `flashdesk serve` gives the runner a thread of its own; the worker process instead
passes `schedule`, which puts jobs on its own request queue, so HTTP jobs and the app's own
generations run in turn on its main thread (never two on the engine at once), which calls
`execute`.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable

from jinja2 import TemplateError

from flashdesk.engine.decode.conversation import STOP, FittedPrompt
from flashdesk.engine.decode.grammar import Grammar
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.speculative import AUTO
from flashdesk.engine.decode.tool_calls import with_marks
from flashdesk.engine.decode.turn import CANCELLED, ChatTurn, TurnEnd
from flashdesk.engine.errors import ContextOverflowError, FlashDeskError
from flashdesk.engine.serve.auth import ANONYMOUS
from flashdesk.engine.serve.logprobs import TokenTexts, entries
from flashdesk.engine.serve.metrics import ServeMetrics

# statuses of finished jobs (JobRecord.status), as HTTP would say them
OK, REFUSED, CLIENT_GONE, FAILED, STOPPING = 200, 400, 499, 500, 503  # 499: nginx's "client closed request"
RECORDS_KEPT = 256  # the newest finished jobs, for the tests and anyone who asks
TIME_LIMIT = "time_limit"  # a reply the server's time limit per request ended (limits.py)


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


# -- events, engine thread -> the request's coroutine ----------------------------------------------------


@dataclass(frozen=True)
class JobStarted:
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens, reused from the previous request's cache
    max_tokens: int  # the reply's limit once the context is counted


@dataclass(frozen=True)
class JobDelta:
    content: str  # answer text completed by this step
    reasoning: str  # thought text completed by this step
    logprobs: tuple[dict, ...] = ()  # the step's tokens' (logprobs.py's chat shape), when the job asks
    prompt_logprobs: tuple[dict, ...] | None = None  # the prompt's (the prefill's step), when the job asks


@dataclass(frozen=True)
class MethodUsage:
    """What one speculative method's steps did in a reply (engine/decode/stats.py's by_method)."""

    speculative_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    tau: float | None = None
    acceptance_rate: float | None = None
    decode_tokens_per_second: float = 0.0

    @classmethod
    def of(cls, s: dict) -> "MethodUsage":
        return cls(
            s["speculative_steps"],
            s["drafted"],
            s["accepted"],
            s["mean_acceptance_length"],
            s["acceptance_rate"],
            s["decode_tokens_per_second"],
        )


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    speculative_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    tau: float | None = None  # mean acceptance length: tokens per speculative verify pass
    acceptance_rate: float | None = None
    decode_tokens_per_second: float = 0.0
    method: str | None = None  # what the reply drafted with: "dflash", "mtp", "auto"; None: nothing drafts
    # the methods that drafted, each with its own figures (empty: nothing was drafted)
    by_method: dict[str, MethodUsage] = field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, end: TurnEnd, method: str | None = None) -> "Usage":
        s = end.stats
        return cls(
            prompt_tokens=s["prompt_tokens"],
            completion_tokens=len(end.token_ids),
            cached_tokens=s["reused_tokens"],
            **asdict(MethodUsage.of(s)),  # the reply's speculation figures, as each method's are read
            method=method,
            by_method={name: MethodUsage.of(figures) for name, figures in sorted(s.get("by_method", {}).items())},
        )


@dataclass(frozen=True)
class JobDone:
    reason: str  # "stop", "length", "context" (the reply filled the context), TIME_LIMIT or "cancelled"
    usage: Usage


@dataclass(frozen=True)
class JobFailed:
    status: int  # 400: the request cannot run (context), 500: the engine failed, 503: the server stopped
    message: str
    code: str | None = None


@dataclass(eq=False)
class Job:
    """A chat completion for the engine. `sink(event)` is called on the engine thread. `fitted`: its
    prompt, made on the HTTP side (None: the engine thread fits `messages` itself); `scope`: whose
    prefixes it may reuse."""

    messages: list[dict]
    sampling: SamplingParams
    max_tokens: int
    thinking: bool = False
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stream: bool = False
    sink: Callable[[object], None] = lambda event: None
    fitted: FittedPrompt | None = None
    scope: str = ANONYMOUS
    logprobs: int | None = None  # each token's log probability with this many alternatives (None: none)
    prompt_logprobs: bool = False  # the prompt's tokens' too
    grammar: Grammar | None = None  # every token of the reply within it (response_format, a forced tool call)
    stop_ids: tuple[int, ...] = ()  # tokens that end the reply beside the model's own (a tool call's)
    marks: bool = False  # content marks where control tokens' text begins (tool_calls.with_marks): read for calls
    id: str = field(default_factory=lambda: new_id())
    cancel_event: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    steps: int = 0  # engine steps completed (the engine thread counts)
    cancel_step: int | None = None  # the step running when the cancel came
    cancelled_by_server: bool = False
    timed_out: bool = False  # the server's time limit cancelled it

    def cancel(self, by_server: bool = False, timed_out: bool = False) -> None:
        """Stop after the engine step in flight (any thread; a second call changes nothing)."""
        if not self.cancel_event.is_set():
            self.cancel_step, self.cancelled_by_server = self.steps, by_server or timed_out
            self.timed_out = timed_out
            self.cancel_event.set()


@dataclass(frozen=True)
class JobRecord:
    """A finished job, for the traffic view and the tests."""

    id: str
    status: int
    reason: str  # the finish reason, or "refused" / "failed"
    usage: Usage
    seconds: float  # from arrival to the end, queue wait included
    last_step: int  # the index of the last engine step run (-1: none)
    cancel_step: int | None
    stream: bool
    message: str = ""


class Runner:
    """Runs Jobs on one engine, in order. `schedule(job)` hands a submitted job to the thread that owns
    the engine, which then calls `execute(job)`; without one, the runner starts that thread itself."""

    def __init__(
        self,
        engine,
        control=None,
        *,
        schedule: Callable[[Job], None] | None = None,
        on_record: Callable[[JobRecord], None] | None = None,
        step_delay: float = 0.0,
    ):
        self.engine, self.control = engine, control
        self.metrics = ServeMetrics(getattr(engine, "methods", ()))
        self.on_record = on_record
        self.step_delay = step_delay  # a testing aid, as the worker's FLASHDESK_WORKER_STEP_DELAY
        self.records: deque[JobRecord] = deque(maxlen=RECORDS_KEPT)
        self._lock = threading.Lock()
        self._pending: dict[str, Job] = {}
        self._running: Job | None = None
        self._closed = False
        self._thread = None
        self._jobs: queue.Queue[Job | None] | None = None  # the own thread's queue (None: its end)
        self._texts: TokenTexts | None = None  # token texts for logprobs, made on the engine's thread
        if schedule is None:
            jobs: queue.Queue[Job | None] = queue.Queue()
            self._thread = threading.Thread(target=self._take, args=(jobs,), name="flashdesk-engine", daemon=True)
            self._thread.start()
            self._jobs, schedule = jobs, jobs.put
        self._schedule = schedule

    @property
    def context_limit(self) -> int:
        return self.engine.context_limit

    @property
    def vocab_size(self) -> int | None:
        """The ids the model takes (a prompt of token ids is checked against it); None: unknown."""
        model = getattr(self.engine, "model", None)
        return model.cfg.vocab_size if model is not None else None

    @property
    def tokenizer(self):
        """The engine's tokenizer, for the HTTP side to copy (prompt.py), never to use."""
        return self.engine.tokenizer

    def method(self) -> str | None:
        """The speculative method the runner's jobs draft with: the control's ("dflash", "mtp" or
        "auto") where it names a loaded one, else the engine's default; None when nothing drafts (no
        draft model loaded, or speculation off). Each step's own method is in the usage's by_method."""
        methods = getattr(self.engine, "methods", None) or {}
        control = self.control
        if not methods or (control is not None and not control.enabled):
            return None
        if control is not None and (control.method == AUTO or control.method in methods):
            return control.method
        return self.engine.method

    def _take(self, jobs: queue.Queue[Job | None]) -> None:
        while (job := jobs.get()) is not None:
            self.execute(job)

    def submit(self, job: Job) -> None:
        """Queue a job (any thread); a closed runner answers it at once with a 503."""
        with self._lock:
            closed = self._closed
            if not closed:
                self._pending[job.id] = job
                self.metrics.move(waiting=1)
        if closed:
            job.sink(JobFailed(STOPPING, "the server is stopping", "server_stopping"))
            return
        self._schedule(job)

    def close(self) -> None:
        """Stop taking jobs: the queued ones end with a 503, the running one after its step."""
        with self._lock:
            self._closed = True
            pending, self._pending = list(self._pending.values()), {}
            running = self._running
            self.metrics.move(waiting=-len(pending))
        for job in pending:
            job.cancel(by_server=True)
            self._finish(job, JobFailed(STOPPING, "the server stopped before this request ran", "server_stopping"), -1)
        if running is not None:
            running.cancel(by_server=True)
        if self._jobs is not None:
            self._jobs.put(None)  # the runner's own thread ends

    def execute(self, job: Job) -> None:
        """Run a submitted job on the calling thread (the one that owns the engine)."""
        with self._lock:
            if self._pending.pop(job.id, None) is None:
                return  # close() already answered it
            self._running = job
            self.metrics.move(waiting=-1, running=1)
        try:
            end, last_step = self._run(job)
        finally:
            with self._lock:
                self._running = None
            self.metrics.move(running=-1)
        self._finish(job, end, last_step)

    def _run(self, job: Job) -> tuple[JobDone | JobFailed, int]:
        """The job on the engine; never raises (the thread that runs it goes on with the next one)."""
        if job.cancel_event.is_set():  # cancelled while it waited
            if job.timed_out:
                return JobFailed(STOPPING, "the request's time limit passed before it ran", "request_timeout"), -1
            return JobDone(CANCELLED, Usage()), -1
        try:
            turn = ChatTurn(
                self.engine,
                job.messages,
                job.sampling,
                job.max_tokens,
                thinking=job.thinking,
                ignore_eos=job.ignore_eos,
                stop=job.stop,
                policy=STOP,
                fitted=job.fitted,
                scope=job.scope,
                logprobs=job.logprobs,
                prompt_logprobs=job.prompt_logprobs,
                grammar=job.grammar,
                stop_ids=job.stop_ids,
            )
        except ContextOverflowError as exc:
            return JobFailed(REFUSED, str(exc), "context_length_exceeded"), -1
        except (FlashDeskError, ValueError, TemplateError) as exc:
            return JobFailed(REFUSED, f"the messages cannot be made into a prompt: {exc}"), -1
        except Exception as exc:  # noqa: BLE001 - a bug, said to the client as a server error
            return JobFailed(FAILED, f"the prompt could not be built: {type(exc).__name__}: {exc}"), -1
        self.metrics.add(prompt_tokens=len(turn.prompt), cached_prompt_tokens=turn.reused)
        job.sink(JobStarted(len(turn.prompt), turn.reused, turn.fitted.max_new_tokens))
        steps = turn.run(self.control, job.cancel_event.is_set)
        last = -1
        try:
            for item in steps:
                if isinstance(item, TurnEnd):
                    reason = TIME_LIMIT if item.reason == CANCELLED and job.timed_out else item.reason
                    return JobDone(reason, Usage.of(item, self.method())), item.last_step
                last = self._step(job, item.event)
        except Exception as exc:  # noqa: BLE001 - the engine failed (out of memory, a driver fault): say so
            return JobFailed(FAILED, f"the engine failed: {type(exc).__name__}: {exc}", "engine_error"), last
        finally:
            steps.close()  # the engine settles its cache before the next job
        return JobFailed(FAILED, "the engine stopped without finishing the reply", "engine_error"), last

    def _step(self, job: Job, event) -> int:
        """Count one engine step and pass its text on; the step's index."""
        job.steps = event.index + 1
        if event.index == 0:
            self.metrics.first_token(time.perf_counter() - job.arrived, len(event.emitted))
        else:
            self.metrics.step(event.seconds, len(event.emitted), len(event.draft), event.accepted, event.method)
        logprobs = self._shown(event.logprobs)
        prompt = self._shown(event.prompt_logprobs) if event.prompt_logprobs is not None else None
        if event.answer or event.thought or logprobs or prompt:
            content = with_marks(event.answer, event.controls) if job.marks else event.answer
            job.sink(JobDelta(content, event.thought, logprobs, prompt))
        if self.step_delay:
            time.sleep(self.step_delay)
        return event.index

    def _shown(self, logprobs) -> tuple[dict, ...]:
        """A step's logprobs as the API shows them (the engine's thread: token texts need the tokenizer)."""
        if not logprobs:
            return ()
        if self._texts is None:
            self._texts = TokenTexts(self.engine.tokenizer)
        return entries(logprobs, self._texts)

    def refused(self, message: str, stream: bool, seconds: float) -> None:
        """Record a request whose prompt was refused before it was queued (it cannot fit the context,
        or cannot be made into a prompt): traffic like any other (any thread)."""
        record = JobRecord(new_id(), REFUSED, "refused", Usage(), seconds, -1, None, stream, message)
        self.records.append(record)
        self.metrics.add(requests=1)
        if self.on_record is not None:
            self.on_record(record)

    def _finish(self, job: Job, end: JobDone | JobFailed, last_step: int) -> None:
        if isinstance(end, JobDone):
            usage, reason, message = end.usage, end.reason, ""
            status = OK if reason != CANCELLED else STOPPING if job.cancelled_by_server else CLIENT_GONE
        else:
            usage, status, message = Usage(), end.status, end.message
            reason = {REFUSED: "refused", STOPPING: CANCELLED}.get(end.status, "failed")
        record = JobRecord(
            job.id,
            status,
            reason,
            usage,
            time.perf_counter() - job.arrived,
            last_step,
            job.cancel_step,
            job.stream,
            message,
        )
        self.records.append(record)
        self.metrics.add(requests=1)
        job.sink(end)
        if self.on_record is not None:
            self.on_record(record)
