"""The worker protocol: typed messages between the app and the engine process, one JSON object a line.

Why here, at the package root (`flashdesk.protocol`): both sides import it and neither may import
the other (the app never imports the engine or torch, the engine never imports Qt), so the
message definitions sit beside them. This module imports only the standard library.

Every message is a small dataclass; `encode()` writes `{"type": <name>, ...fields}` and `decode()`
reads it back, ignoring fields it does not know, so either side can add an optional field first.
Requests go from the app to the worker, events from the worker to the app.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

PROTOCOL_VERSION = 1

# Error kinds (Error.kind): what the window tells the user.
OUT_OF_MEMORY = "out_of_memory"  # CUDA or host memory ran out; the worker stays up
BAD_INPUT = "bad_input"  # a folder, setting or prompt the engine refuses, with its reason
CRASH = "crash"  # anything else: a bug or a driver fault

AUTO_DRAFT_LENGTH = "auto"  # SetSpeculation.draft_length: chosen each step by the engine
# the speculative methods (Loaded.method), as the window names them
METHOD_NAMES = {"dflash": "DFlash", "mtp": "MTP"}
BENCH_RUNS_SHOWN = 50  # BenchRuns holds at most this many

# Origins of answer text (Step.spans): an accepted draft token, or a token the target chose.
DRAFT = "d"
TARGET = "t"

_REGISTRY: dict[str, type] = {}


def message(name: str):
    """Register a dataclass as the message `name`."""

    def register(cls):
        cls.TYPE = name
        _REGISTRY[name] = cls
        return cls

    return register


class ProtocolError(ValueError):
    """A line that is not a known message."""


def encode(msg: Any) -> str:
    """One JSON line (no newline) for a registered message."""
    return json.dumps({"type": msg.TYPE, **asdict(msg)}, ensure_ascii=False, separators=(",", ":"))


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "list": list,
    "dict": dict,
    "None": type(None),
}


def _type_problem(value: Any, annotation: str) -> str | None:
    """What is wrong with `value` for a field annotated `annotation` ("int | None", "list[dict]"...),
    or None; only the JSON types are checked (anything else is left to the handler)."""
    options = [part.strip() for part in annotation.split("|")]
    names = [option.split("[")[0] for option in options]
    if any(name not in _JSON_TYPES for name in names):
        return None
    for option, name in zip(options, names):
        if isinstance(value, bool) and name in ("int", "float"):
            continue  # JSON's true is not a number
        if isinstance(value, _JSON_TYPES[name]):
            inner = option[len(name) + 1 : -1] if option.endswith("]") else ""
            if name == "list" and inner in _JSON_TYPES and isinstance(value, list):
                if not all(isinstance(v, _JSON_TYPES[inner]) for v in value):
                    return f"must be a list of {inner}"
            return None
    return f"must be {' or '.join(names)}, got {type(value).__name__}"


def decode(line: str | bytes) -> Any:
    """The message a line holds; unknown fields are dropped, missing optional ones defaulted, and a
    field of the wrong JSON type is refused."""
    try:
        data = json.loads(line)
    except RecursionError:
        raise ProtocolError(f"not JSON this worker reads: nested too deeply: {line[:200]!r}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}: {line[:200]!r}") from exc
    if not isinstance(data, dict) or data.get("type") not in _REGISTRY:
        raise ProtocolError(f"unknown message: {str(line)[:200]}")
    cls = _REGISTRY[data["type"]]
    known = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in known}
    missing = [
        f.name for f in fields(cls) if f.name not in kwargs and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ProtocolError(f"{data['type']} message lacks {', '.join(missing)}")
    for f in fields(cls):
        assert isinstance(f.type, str)  # `from __future__ import annotations`: an annotation's text
        problem = _type_problem(kwargs[f.name], f.type) if f.name in kwargs else None
        if problem:
            raise ProtocolError(f"{data['type']} message: {f.name} {problem}")
    return cls(**kwargs)


# --- requests: app -> worker -------------------------------------------------------------------


@message("inspect")
@dataclass
class Inspect:
    """Check model folders as the loader would and estimate memory, loading no weights."""

    target: str
    draft: str | None = None
    context: int | None = None
    device: str = "auto"  # the plan is for this device: "cuda" (GPU memory) or "cpu" (RAM); auto as Load
    assistant: str | None = None  # Gemma 4's MTP assistant beside a DFlash drafter in `draft`
    models_folder: str | None = None  # where Hub ids are looked for (as Load); None: HF_HUB_CACHE or its default


@message("survey")
@dataclass
class Survey:
    """What the setup page offers (no model needs to be loaded): answered by Surveyed."""

    demo_folder: str | None = None  # where the demo pair is made, to list it when it is there
    models_folder: str | None = None  # the Hub models to list are here (as Load)


@message("create_demo")
@dataclass
class CreateDemo:
    """Write the tiny random demo target and drafter under `folder` (if not there yet)."""

    folder: str


@message("load")
@dataclass
class Load:
    target: str
    draft: str | None = None  # a DFlash drafter or Gemma 4's MTP assistant (told apart by its config)
    device: str = "auto"
    dtype: str = "auto"
    kv_dtype: str = "auto"
    context: int | None = None
    assistant: str | None = None  # Gemma 4's MTP assistant beside a DFlash drafter in `draft`
    # the app's models folder (its Settings): the Hugging Face cache the engine downloads into and
    # finds Hub ids in; None: HF_HUB_CACHE or its default, as the worker was started with
    models_folder: str | None = None


@message("generate")
@dataclass
class Generate:
    """A chat turn: `messages` are {"role": system|user|assistant, "content": str} dicts. Ending with an
    assistant message, it goes on writing that reply (one the context cut off) instead of a new one."""

    request_id: str
    messages: list[dict]
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 1024
    thinking: bool = False
    ignore_eos: bool = False  # for tests and benchmarks: run to max_tokens
    context_policy: str = "drop_oldest"  # or "stop": what a conversation past the context does
    reuse: bool = True  # reuse the cached prefix of earlier turns (False: prefill from scratch)


@message("count_tokens")
@dataclass
class CountTokens:
    """How many tokens `messages` make as a prompt, for the message box's gauge; answered by
    TokenCount at once, even while a generation runs."""

    request_id: str
    messages: list[dict]
    thinking: bool = False


@message("cancel")
@dataclass
class Cancel:
    """Stop the generation `request_id` after the step that is running."""

    request_id: str


@message("set_speculation")
@dataclass
class SetSpeculation:
    """Speculation on/off, the draft length (None: the method's default; "auto": chosen each step for
    the most tokens per second) and the method ("dflash", "mtp", "auto": each step the method and
    length expected fastest; None: the loaded default); applies from the next step."""

    enabled: bool
    draft_length: int | str | None = None
    method: str | None = None


@message("pull")
@dataclass
class Pull:
    """Download the Hub model `repo_id` into the Hugging Face cache (no model needs to be loaded).

    Answered by PullProgress events, then Pulled, PullCancelled or an Error (during "pull").
    """

    repo_id: str
    models_folder: str | None = None  # downloaded into this folder (as Load)


@message("cancel_pull")
@dataclass
class CancelPull:
    """Stop the download of `repo_id` (running or queued); the bytes already on disk are kept."""

    repo_id: str


@message("bench")
@dataclass
class Bench:
    """Benchmark the loaded models (engine/bench/, as `flashdesk bench`): the built-in prompts of
    `tasks`, AR and each of `methods` (empty: every loaded one, and "auto" with two) at each of
    `draft_lengths` (whole numbers and "auto"), interleaved. Answered by BenchProgress events, then
    BenchResult; Cancel(request_id) stops it within one engine step."""

    request_id: str
    tasks: list[str]
    draft_lengths: list
    prompts_per_task: int = 4
    max_new_tokens: int = 128
    methods: list[str] = field(default_factory=list)


@message("bench_history")
@dataclass
class BenchHistory:
    """The bench runs kept in the data folder (every device and model pair), answered by BenchRuns."""

    request_id: str


@message("start_server")
@dataclass
class StartServer:
    """Serve the loaded model over HTTP, as `flashdesk serve` does (OpenAI-compatible API); answered by
    ServerState. HTTP requests take turns with the app's own generations. Any `host` but a loopback
    address needs `api_key`; port 0 takes a free port. Load and Unload stop the server first."""

    host: str = "127.0.0.1"
    port: int = 8719
    api_key: str | None = None


@message("stop_server")
@dataclass
class StopServer:
    """Stop serving: queued HTTP requests get a 503, a running one stops after its step; answered by
    ServerState(running=False)."""


@message("unload")
@dataclass
class Unload:
    pass


@message("shutdown")
@dataclass
class Shutdown:
    pass


# --- events: worker -> app ---------------------------------------------------------------------


@message("ready")
@dataclass
class Ready:
    """The worker is up (torch imported) and reads requests."""

    pid: int
    protocol: int = PROTOCOL_VERSION
    torch: str = ""
    cuda: bool = False


@message("inspected")
@dataclass
class Inspected:
    target: str
    draft: str | None
    lines: list[str]  # the doctor's lines for the target, then the drafter's
    problems: list[str]
    memory_bytes: int | None = None  # device memory estimate at `context` (target + drafter)
    context: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


@message("surveyed")
@dataclass
class Surveyed:
    """The recommended pair (Hub ids) and whether it fits GPU 0 before downloading (its memory plan
    with fp8 KV): `context` is what one click loads (0: it does not fit), `text` the verdict in one
    sentence; `models` are on disk: {"name", "kind" (target, drafter, assistant, demo), "target",
    "draft", "size", "complete"}; `assistant`, where known: Gemma 4's MTP assistant offered beside
    the pair, its Hub id, download size and the fit of all three (engine/hub/recommended.py)."""

    recommended: list[str]
    download_bytes: int
    device_name: str | None
    free_bytes: int
    total_bytes: int
    fits: bool
    context: int
    longest_context: int
    needed_bytes: int
    text: str
    models: list[dict] = field(default_factory=list)
    assistant: dict | None = None


@message("demo_created")
@dataclass
class DemoCreated:
    target: str
    draft: str


@message("load_progress")
@dataclass
class LoadProgress:
    stage: str
    fraction: float  # 0..1; -1 when the stage has no measurable progress
    text: str = ""


@message("loaded")
@dataclass
class Loaded:
    target: str
    draft: str | None
    name: str  # a short model name for the window
    device: str  # "cpu" or "cuda:0"
    device_name: str
    device_uuid: str | None  # NVML's "GPU-..." id of the CUDA device, to match telemetry to it
    dtype: str
    kv_dtype: str
    context_limit: int
    block_size: int | None  # the longest draft plus one (a DFlash drafter's block); None without a draft model
    memory_bytes: int  # what the load allocated on the device (CUDA) or the worker's RSS (CPU)
    seconds: float
    layers: int = 0
    vocab: int = 0
    sampling_defaults: dict = field(default_factory=dict)  # from generation_config.json
    # what speculation drafts with no draft length set: the fastest of the kept benches on this card
    # (an int or AUTO_DRAFT_LENGTH), None: the drafter's longest; and why, in words
    default_draft_length: int | str | None = None
    default_note: str = ""
    # kernel families that failed their self-test on this card and run on torch, in one line ('' if none)
    kernel_note: str = ""
    method: str | None = None  # the default speculative method: "dflash", "mtp", or None without a draft model
    methods: list[str] = field(default_factory=list)  # every loaded method (both: the app offers a choice)


@message("pull_progress")
@dataclass
class PullProgress:
    """Bytes of `repo_id` on disk out of all its engine files (at most about 10 a second).

    `total_bytes` is 0 while the file list is not known yet; `file` is the file being downloaded.
    """

    repo_id: str
    file: str
    done_bytes: int
    total_bytes: int


@message("pull_checked")
@dataclass
class PullChecked:
    """What the engine would make of `repo_id`, from its configs and safetensors headers, sent
    during a Pull once the small files are in and before the weights (`flashdesk models verify`)."""

    repo_id: str
    lines: list[str]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


@message("pulled")
@dataclass
class Pulled:
    """`repo_id` is complete and checked in the cache: `folder` is its snapshot."""

    repo_id: str
    folder: str
    size: int = 0


@message("pull_cancelled")
@dataclass
class PullCancelled:
    """The download stopped at the app's request; a later Pull continues from `done_bytes`."""

    repo_id: str
    done_bytes: int = 0
    total_bytes: int = 0


@message("unloaded")
@dataclass
class Unloaded:
    pass


@message("started")
@dataclass
class Started:
    request_id: str
    prompt_tokens: int
    reused_tokens: int = 0  # of prompt_tokens, found in the cache from earlier turns (not prefilled)
    dropped_messages: int = 0  # the oldest messages left out to fit the context (drop_oldest policy)
    max_tokens: int = 0  # the reply's limit: Generate.max_tokens capped to the room the context leaves
    cut_chars: int = 0  # a reply continued: characters of its start left out of the prompt to fit


@message("token_count")
@dataclass
class TokenCount:
    request_id: str
    tokens: int  # the prompt's length, the generation prompt included
    context_limit: int


@message("step")
@dataclass
class Step:
    """One engine step: index 0 is the prefill (which yields the first token)."""

    request_id: str
    index: int
    emitted: list[int]
    draft: list[int]  # empty when the step did not speculate
    accepted: int
    answer: str  # answer text completed by this step
    thought: str  # thought text completed by this step
    spans: list[list] = field(default_factory=list)  # [[chars, DRAFT|TARGET], ...] covering `answer`
    seconds: float = 0.0  # the step's engine time (prefill time for index 0)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    elapsed: float = 0.0  # seconds since the worker started this request, when the step ended
    stats: dict | None = None  # running speculation statistics (engine/decode/stats.py summary)
    method: str | None = None  # the draft model that drafted this step ("dflash", "mtp"; None: none did)


@message("finished")
@dataclass
class Finished:
    request_id: str
    reason: str  # "stop", "length", "context" (the reply filled the context), "cancelled"
    text: str
    thought: str
    token_ids: list[int]
    prompt_tokens: int
    prefill_seconds: float
    elapsed: float
    stats: dict
    last_step: int  # the index of the last step run
    cancel_step: int | None = None  # the step that was running when the cancel arrived


@message("bench_progress")
@dataclass
class BenchProgress:
    request_id: str
    done: int  # runs done (one prompt in one mode; the warm-ups count)
    total: int
    text: str = ""  # what just ran, e.g. "code 2/8 | DFlash K=8"


@message("bench_result")
@dataclass
class BenchResult:
    """The run's report (`flashdesk bench --json`'s object without the token ids; kept in the data
    folder), or cancelled with no report."""

    request_id: str
    report: dict | None = None
    cancelled: bool = False


@message("bench_runs")
@dataclass
class BenchRuns:
    """Kept bench runs, newest first (at most BENCH_RUNS_SHOWN): each a report as in BenchResult."""

    request_id: str
    runs: list[dict] = field(default_factory=list)


@message("server_state")
@dataclass
class ServerState:
    """Whether the HTTP server runs: `url` (e.g. http://127.0.0.1:8719; the API is under /v1) and the
    `model` name it serves, or why it could not start (`error`)."""

    running: bool
    url: str = ""
    error: str = ""
    model: str = ""
    host: str = ""
    port: int = 0
    api_key_required: bool = False


@message("server_traffic")
@dataclass
class ServerTraffic:
    """One chat completion the HTTP server ran (or refused once queued), when it ended.

    `status` as HTTP says it: 200, 400 (refused: the context), 499 (the client went away and its
    generation was stopped), 500 (the engine failed), 503 (the server stopped first)."""

    request_id: str
    status: int
    reason: str  # "stop", "length", "context", "cancelled", "refused", "failed"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, reused from the previous request
    completion_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    tau: float | None = None  # mean acceptance length; None when nothing was drafted
    seconds: float = 0.0  # from arrival to the end, the wait for the engine included
    tokens_per_second: float = 0.0  # decode speed
    stream: bool = False
    message: str = ""  # why, when it was not a 200
    method: str | None = None  # what it drafted with: "dflash", "mtp", "auto"; None: nothing drafted


@message("error")
@dataclass
class Error:
    kind: str  # OUT_OF_MEMORY, BAD_INPUT or CRASH
    message: str
    during: str = ""  # "load", "generate", "inspect", "demo", "pull", "bench", "request"
    request_id: str | None = None
    details: str = ""  # a traceback for crashes
