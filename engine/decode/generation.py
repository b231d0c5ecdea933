"""The one streaming API: a request in, an iterator of per-step events out.

The CLI, the worker process, the benchmarks and the tests all drive generation through
`Engine.generate()`, so they all see the same tokens, text, stop handling and timing.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from flashdesk.engine.loading.build import load_assistant, load_draft_model_config, load_drafter, load_target
from flashdesk.engine.decode.chat_format import ANSWER, ChannelSplitter, StopStrings, eos_ids, load_tokenizer
from flashdesk.engine.loading.model_card import suppress_tokens
from flashdesk.engine.model.assistant import is_assistant_folder
from flashdesk.engine.model.config import load_config
from flashdesk.engine.decode.mtp import MtpDrafter
from flashdesk.engine.errors import ConfigError, ContextOverflowError
from flashdesk.engine.model.cuda_graphs import StepGraphs, graphs_wanted
from flashdesk.engine.model.gemma4 import Gemma4
from flashdesk.engine.model.kv_cache import KVCache
from flashdesk.engine.model.drafter import DraftContext, Drafter, resolve_draft_quantize
from flashdesk.engine.loading.memory_plan import context_that_fits
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.draft_length import AutoDraftLength, costs_file, load_costs, save_costs
from flashdesk.engine.decode.kernel_warmup import compile_generation_kernels
from flashdesk.engine.decode.grammar import Grammar, GrammarState, vocabulary
from flashdesk.engine.decode.logprobs import TokenLogprob
from flashdesk.engine.decode.prefix_cache import LOCAL, PrefixCache
from flashdesk.engine.decode.speculative import AUTO, Decoder, SpecControl, StepResult
from flashdesk.engine.decode.stats import SpecStats, StepRecord
from flashdesk.kernels import self_test
from flashdesk.kernels.backend import describe, fallbacks, pdl_off_reason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    ignore_eos: bool = False
    stop_strings: tuple[str, ...] = ()
    reuse: bool = True  # start from the longest prefix an earlier request left in the cache
    scope: str = LOCAL  # whose request: only prefixes left by requests of the same scope are reused
    logprobs: int | None = None  # each emitted token's log probability and this many alternatives (None: none)
    prompt_logprobs: bool = False  # the prompt's too (the prefill's event): the whole prompt runs, nothing reused
    grammar: Grammar | None = None  # every sampled token within it (grammar.py)
    stop_ids: tuple[int, ...] = ()  # tokens that end this reply beside the model's own (a tool call's <|tool_response>)


@dataclass(frozen=True)
class StepEvent:
    """One step: the prefill (index 0, which yields the first token) or one decode step."""

    index: int
    emitted: list[int]  # token ids appended by this step
    draft: list[int]  # drafted ids (empty without speculation)
    accepted: int  # how many of `draft` were accepted
    answer: str  # answer text completed by this step
    thought: str  # thought text completed by this step
    seconds: float
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    method: str | None = None  # the draft model that drafted ("dflash", "mtp"; None: a plain step)
    logprobs: list[TokenLogprob] | None = None  # one per token of the reply in `emitted`, when asked
    prompt_logprobs: list[TokenLogprob] | None = None  # the prefill's event, when asked: one per prompt token
    # where in `answer` the text of a control token (an added token: <|tool_call>, <|"|>) begins, so a
    # reader tells the model's real control tokens from their characters spelled out (tool_calls.py)
    controls: tuple[int, ...] = ()


@dataclass(frozen=True)
class FinishEvent:
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    token_ids: list[int]
    text: str
    thought: str
    stats: dict


class _TextOutput:
    """Token ids -> (answer, thought) text, with stop strings applied to the answer."""

    def __init__(self, tokenizer, stop_strings):
        self.splitter = ChannelSplitter(tokenizer) if tokenizer is not None else None
        self.stops = StopStrings(list(stop_strings))
        self.answer, self.thought = [], []
        self.tokenizer = tokenizer
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self.control_ids = frozenset(int(tid) for tid in added)  # tokens whose text is never spelled out
        self._control_texts: dict[int, str] = {}
        self._fed = 0  # answer characters handed to the stop strings (their output is a prefix of them)
        self._shown = 0  # answer characters of the events so far
        self._marks: list[int] = []  # where a control token's text begins in the answer, not yet in an event

    def push(self, ids: list[int]) -> tuple[str, str, int | None]:
        """The text `ids` complete, and where a stop string was hit: how many of `ids` it took (the
        rest of a speculative step is not part of the reply, and is not counted), None if none was."""
        if self.splitter is None:
            return "", "", None
        answer, thought = [], []
        for i, tid in enumerate(ids):
            pieces = self.splitter.push(tid)
            if tid in self.control_ids:
                self._mark(pieces, tid)
            more_answer, more_thought, hit = self._route(pieces)
            answer.append(more_answer)
            thought.append(more_thought)
            if hit:
                return "".join(answer), "".join(thought), i + 1
        return "".join(answer), "".join(thought), None

    def finish(self) -> tuple[str, str]:
        if self.splitter is None:
            return "", ""
        answer, thought, _ = self._route(self.splitter.flush())
        tail = self.stops.flush()
        self.answer.append(tail)
        return answer + tail, thought

    def _mark(self, pieces, tid: int) -> None:
        """Note where control token `tid`'s text begins in the answer: at the end of the piece it completes."""
        text = self._control_texts.get(tid)
        if text is None:
            text = self._control_texts[tid] = self.tokenizer.decode([tid], skip_special_tokens=False)
        if text and pieces and pieces[-1].channel == ANSWER and pieces[-1].text.endswith(text):
            fed = sum(len(piece.text) for piece in pieces if piece.channel == ANSWER)
            self._marks.append(self._fed + fed - len(text))

    def controls(self, answer: str) -> tuple[int, ...]:
        """Where control tokens' text begins in `answer`, the answer text of the next event."""
        start = self._shown
        self._shown += len(answer)
        found = tuple(at - start for at in self._marks if at < self._shown)
        self._marks = [at for at in self._marks if at >= self._shown]
        return found

    def _route(self, pieces) -> tuple[str, str, bool]:
        answer, thought, hit = [], [], False
        for piece in pieces:
            if piece.channel == ANSWER:
                self._fed += len(piece.text)
                text, hit = self.stops.push(piece.text)
                answer.append(text)
                if hit:
                    break
            else:
                thought.append(piece.text)
        self.answer += answer
        self.thought += thought
        return "".join(answer), "".join(thought), hit


class Engine:
    """A loaded target model with its tokenizer and stop tokens, ready to generate; with a DFlash
    drafter, Gemma 4's MTP assistant (`mtp`) or both, each step's speculative method."""

    def __init__(
        self,
        model: Gemma4,
        tokenizer,
        eos: set[int],
        kv_dtype: str,
        context_limit: int,
        drafter: Drafter | None = None,
        mtp: MtpDrafter | None = None,
    ):
        self.model, self.tokenizer, self.eos = model, tokenizer, eos
        self.kv_dtype, self.context_limit, self.drafter, self.mtp = kv_dtype, context_limit, drafter, mtp
        self.prefix_budget: int | None = None  # host bytes for kept conversations (None: default_budget())
        self.graphs_on, self.graphs_note = graphs_wanted(model.device)
        # launch each decode step before handing on the previous one's tokens, so the host's work on
        # them (text, events, the app or the API) runs while the device computes; on the CPU, where a
        # launch is the computation, that would only hold the tokens back a step
        self.pipelined = model.device.type == "cuda"
        self._cache: KVCache | None = None  # one cache and drafter context, at the context limit,
        self._ctx: DraftContext | None = None  # for every generation (allocated at the first)
        self._graphs: StepGraphs | None = None
        self._prefix: PrefixCache | None = None
        self.methods = {d.method: d for d in (drafter, mtp) if d is not None}  # "dflash", "mtp"
        self.default_method: str | None = next(iter(self.methods), None)  # what a control names no method drafts
        # each method's automatic draft length: its costs and acceptance, kept from one generation to the next
        self.autos = {name: AutoDraftLength(d.max_draft_length) for name, d in self.methods.items()}
        self.costs_paths: dict[str, Path] = {}  # where this card's measured step costs are kept (load sets them)
        # what the default method drafts when no draft length is asked for: the fastest of the user's
        # own bench on this card (auto where it was at least as fast as the best fixed K), else the
        # method's own default
        self.default_draft_length: int | str | None = None
        self.default_note = ""  # why, in words (empty: no bench of this pair on this card yet)
        self.kernel_checks: list = []  # the kernel self-tests' results at load (kernels/self_test.py)
        self.suppress_tokens: tuple[int, ...] = ()  # generation_config.json's: never emitted

    @property
    def method(self) -> str | None:
        """The default speculative method: "dflash", "mtp", or None (plain decoding only)."""
        return self.default_method

    @property
    def max_draft_length(self) -> int:
        """The most tokens a step of any loaded method may draft (0: no draft model)."""
        return max((d.max_draft_length for d in self.methods.values()), default=0)

    @property
    def method_draft_length(self) -> int | None:
        """The default method's own default draft length (a DFlash drafter's whole block, a few MTP
        steps); None without a draft model."""
        return self.methods[self.default_method].default_draft_length if self.default_method else None

    @property
    def auto(self) -> AutoDraftLength | None:
        """The default method's automatic draft length."""
        return self.autos.get(self.default_method) if self.default_method else None

    @auto.setter
    def auto(self, value: AutoDraftLength) -> None:
        if self.default_method is None:
            raise ValueError("no draft model is loaded: there is no automatic draft length to set")
        self.autos[self.default_method] = value

    @property
    def costs_path(self) -> Path | None:
        """The default method's file of measured step costs."""
        return self.costs_paths.get(self.default_method) if self.default_method else None

    def use_method(self, method: str) -> None:
        """Make `method` ("dflash" or "mtp", loaded) the default; the default length is its own again."""
        if method not in self.methods:
            loaded = " and ".join(self.methods) or "none"
            raise ValueError(f"no {method} draft model is loaded (loaded: {loaded})")
        if method != self.default_method:
            self.default_method, self.default_draft_length, self.default_note = method, None, ""

    @staticmethod
    def fallback_note() -> str:
        """One line when kernel families run on their torch path after failing their self-test on
        this card (else ''): which, and what it means."""
        failed = sorted(fallbacks())
        notes = [f"programmatic dependent launch is off: {pdl_off_reason()}"] if pdl_off_reason() else []
        if failed:
            notes.append(
                f"{', '.join(failed)} {'runs' if len(failed) == 1 else 'run'} on the slower torch path: "
                f"{'it' if len(failed) == 1 else 'they'} failed the kernel self-test on this card"
            )
        if not notes:
            return ""
        return "; ".join(notes) + " (replies stay correct; `flashdesk doctor --kernels` shows the errors)"

    def cuda_graphs(self) -> str:
        """In words: whether decode and verify steps run as CUDA graphs (and why not)."""
        if self._graphs is not None and self._graphs.error:
            return f"capture failed, steps run eagerly ({self._graphs.error})"
        return self.graphs_note

    def _step_state(self) -> PrefixCache:
        """The one cache and drafter context every generation continues, allocated once at the
        context limit (the memory plan counts them; CUDA graphs hold their addresses), and the
        prefix cache that says what they hold."""
        if self._prefix is None:
            slack = max(16, self.drafter.cfg.block_size) if self.drafter else 16
            self._cache = self.model.new_cache(self.context_limit, self.kv_dtype, slack=slack)
            self._ctx = self.drafter.new_context(self.context_limit) if self.drafter else None
            if self.graphs_on:
                taps = self.drafter.cfg.target_layer_ids if self.drafter else ()
                self._graphs = StepGraphs(self.model, self._cache, taps, self.drafter, self._ctx)
            self._prefix = PrefixCache(self._cache, self._ctx, self.prefix_budget)
        return self._prefix

    def compile_kernels(self) -> float | None:
        """Compile every Triton kernel a generation launches now, in parallel, rather than one by
        one during the first replies; the seconds it took, or None where kernels do not compile
        ahead (the torch kernels, the interpreter). Allocates the step state (the memory plan
        counts it); before the first generation only (the cache must be empty)."""
        state = self._step_state()
        rows = self.max_draft_length + 1
        return compile_generation_kernels(
            self.model, state.cache, self.drafter, state.ctx, block_rows=rows, mtp=self.mtp
        )

    def reusable_tokens(self, prompt_ids: list[int], scope: str = LOCAL) -> int:
        """How many of the prompt's tokens the next generation of `scope` would take from earlier ones."""
        return self._prefix.reusable(list(prompt_ids), scope) if self._prefix is not None else 0

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        device: str = "auto",
        dtype: str = "auto",
        kv_dtype: str = "auto",
        context_limit: int | None = None,
        draft_dir: str | Path | None = None,
        quantize: str | None = None,
        progress=None,
        draft_quantize: str | None = "auto",
        stage=None,
        draft_default=None,
        assistant_dir: str | Path | None = None,
    ) -> "Engine":
        """Load the target (and draft models) on the device. `progress(fraction)` follows the weights
        read: the target takes 0..0.95 of the way, the draft models the rest. On a GPU the kernels are then
        compiled (compile_kernels), announced through `stage(text)`. `draft_default(device,
        model_dir, draft_dir)` -> (length, note), when given, sets the default draft length
        (use_draft_default; the app and the CLI pass bench/results.benched_default).

        `draft_dir` holds a DFlash drafter or a Gemma 4 MTP assistant, told apart by its config;
        `assistant_dir` an MTP assistant beside a drafter in `draft_dir` (both load; each step picks
        one: SpecControl.method). `draft_quantize` applies to a drafter (an assistant is small and
        stays in the model's dtype). The default method is the drafter's where one is loaded."""
        dev = resolve_device(device)
        draft_quantize = resolve_draft_quantize(draft_quantize, dev)
        torch_dtype = resolve_dtype(dtype, dev)
        kv = resolve_kv_dtype(kv_dtype, dev, torch_dtype)
        # before the memory plan: a family that fails on this card runs on torch, which plans otherwise
        checks = self_test.ensure(
            dev, announce=lambda: stage and stage("checking the GPU kernels on this card (once per driver and version)")
        )
        if dev.type == "cpu":
            torch.set_num_threads(cpu_threads(Path(model_dir)))
        folders = draft_folders(draft_dir, assistant_dir)  # method -> folder
        if dev.type == "cuda":  # refuse before loading a byte when it cannot fit; else pick the context
            cfg = load_config(model_dir)
            draft_cfgs = tuple(load_draft_model_config(folder) for folder in folders.values())
            free, _ = torch.cuda.mem_get_info(dev)
            context_limit = context_that_fits(
                model_dir, cfg, draft_cfgs or None, kv, context_limit, quantize, free, torch_dtype.itemsize
            )
        model = load_target(model_dir, dev, torch_dtype, quantize, _share(progress, 0.0, 0.95 if folders else 1.0))
        drafter, mtp = None, None
        share = 0.05 / max(1, len(folders))
        if "dflash" in folders:
            drafter = load_drafter(folders["dflash"], model, _share(progress, 0.95, share), draft_quantize)
        if "mtp" in folders:
            mtp = MtpDrafter(model, load_assistant(folders["mtp"], model, _share(progress, 1.0 - share, share)))
        tokenizer = load_tokenizer(model_dir) if _has_tokenizer(Path(model_dir)) else None
        eos = eos_ids(model_dir) or set(model.cfg.eos_token_ids)
        limit = min(context_limit or model.cfg.max_position_embeddings, model.cfg.max_position_embeddings)
        engine = cls(model, tokenizer, eos, kv, limit, drafter, mtp)
        engine.kernel_checks = checks
        engine.suppress_tokens = suppress_tokens(Path(model_dir), model.cfg.vocab_size)
        for method, folder in folders.items():
            quantized = draft_quantize if method == "dflash" else None
            engine.costs_paths[method] = _costs_path(dev, model_dir, folder, torch_dtype, kv, quantized)
        if engine.method is not None and draft_default is not None:
            engine.use_draft_default(*draft_default(dev, model_dir, folders[engine.method]))
        if dev.type == "cuda":
            if stage is not None:
                stage("compiling the GPU kernels (the first load on this machine takes longest)")
            try:
                engine.compile_kernels()
            except Exception as exc:  # noqa: BLE001 - they compile at first use instead, and fail there if they must
                log.warning(
                    "flashdesk: kernels not compiled ahead (%s: %s); they compile at first use", type(exc).__name__, exc
                )
        return engine

    def use_draft_default(self, best: int | str | None, note: str) -> None:
        """Draft `best` tokens (or auto) when a control names no length, `note` saying why in words
        (bench/results.benched_default: the fastest mode of the newest kept bench of this pair on
        this card); a value this drafter cannot draft is ignored."""
        if self.method is None:
            return
        if best == AUTO or (isinstance(best, int) and 1 <= best <= self.max_draft_length):
            self.default_draft_length, self.default_note = best, note

    def check_request(self, prompt: list[int], max_new_tokens: int) -> None:
        """Refuse a request the model cannot run: empty, out of vocabulary, or over the context."""
        prompt_len = len(prompt)
        if prompt_len == 0:
            raise ValueError("the prompt is empty: give at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if prompt_len + max_new_tokens > self.context_limit:
            raise ContextOverflowError(
                f"the prompt of {prompt_len} tokens plus {max_new_tokens} new tokens needs "
                f"{prompt_len + max_new_tokens} positions, over the context limit of {self.context_limit}; "
                "shorten the prompt or lower max new tokens"
            )
        vocab = self.model.cfg.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")

    def generate(
        self, request: GenerationRequest, control: SpecControl | None = None
    ) -> Generator[StepEvent | FinishEvent, None, None]:
        """Prefill, then one event per decode step, then a FinishEvent. Greedy when temperature is 0.

        With a drafter loaded, `control` (default: speculation on, full draft length) is read at the
        start of every step, so it can be changed while the generation runs.
        """
        prompt = list(request.prompt_ids)
        self.check_request(prompt, request.max_new_tokens)
        eos = set() if request.ignore_eos else self.eos | set(request.stop_ids)
        grammar = self.grammar_state(request.grammar) if request.grammar is not None else None
        measuring = []  # the methods whose costs this generation measures, if it drafts automatically
        for method, auto in self.autos.items():
            if auto.costs is None and method in self.costs_paths:
                auto.costs = load_costs(self.costs_paths[method], auto.max_k)  # else the first auto step measures
                if auto.costs is None:
                    measuring.append(method)
        prefix = self._step_state()
        try:
            reused = prefix.start(prompt, request.reuse and not request.prompt_logprobs, request.scope)
        except Exception:  # its bookkeeping is half updated: forget what it kept, keep the buffers
            self._prefix = PrefixCache(prefix.cache, prefix.ctx, self.prefix_budget)
            raise
        sampling = request.sampling  # with the checkpoint's suppressed tokens, greedy or not
        if self.suppress_tokens and not set(self.suppress_tokens) <= set(sampling.suppress):
            sampling = replace(sampling, suppress=tuple(sorted({*sampling.suppress, *self.suppress_tokens})))
        decoder = Decoder(
            self.model,
            self.drafter,
            self.context_limit,
            self.kv_dtype,
            sampling,
            eos,
            self._cache,
            self._ctx,
            self._graphs,
            self.autos,
            self.default_draft_length,
            self.mtp,
            self.default_method,
            request.logprobs,
            grammar,
        )
        text = _TextOutput(self.tokenizer, request.stop_strings)
        tokens: list[int] = []
        counted: int | None = None  # the reply's tokens, when a stop string ended it inside a step
        stats = SpecStats()
        whole = False  # whether the cache holds exactly prompt + tokens[:-1] when this ends
        flight = None  # the next step, launched before this one's tokens are handed on
        try:
            t0 = time.perf_counter()
            first = decoder.prefill(prompt, reused, request.prompt_logprobs)
            result = StepResult([first], [], 0, 0.0, 0.0, logprobs=decoder.first_logprobs)
            prefill_seconds = time.perf_counter() - t0
            grammar_at_prefill = grammar.seconds if grammar is not None else 0.0
            index = 0
            while True:
                tokens += result.emitted
                stopped = bool(result.emitted) and result.emitted[-1] in eos
                if self.pipelined and index and not stopped and len(tokens) < request.max_new_tokens:
                    # from the second decode step on: the first token goes out at once, before the
                    # prompt's snapshot and the first step (which may calibrate the draft length)
                    flight = decoder.launch(request.max_new_tokens - len(tokens), control)
                answer, thought, hit_at = text.push(result.emitted[:-1] if stopped else result.emitted)
                if hit_at is not None:  # the reply ends at the token that completed the stop string
                    counted = len(tokens) - len(result.emitted) + hit_at
                hit = hit_at is not None
                finish = "stop" if stopped or hit else "length" if len(tokens) >= request.max_new_tokens else None
                if finish:
                    tail_answer, tail_thought = text.finish()
                    answer, thought = answer + tail_answer, thought + tail_thought
                if index:
                    stats.add(
                        StepRecord(
                            tuple(result.draft),
                            result.accepted,
                            tuple(result.emitted),
                            result.draft_seconds,
                            result.verify_seconds,
                            result.method,
                        )
                    )
                seconds = prefill_seconds if index == 0 else result.draft_seconds + result.verify_seconds
                logprobs = result.logprobs
                if logprobs is not None and hit_at is not None:  # as the count: up to the stop string
                    logprobs = logprobs[:hit_at]
                whole = True
                yield StepEvent(
                    index,
                    result.emitted,
                    result.draft,
                    result.accepted,
                    answer,
                    thought,
                    seconds,
                    result.draft_seconds,
                    result.verify_seconds,
                    result.method,
                    logprobs,
                    decoder.prompt_logprobs if index == 0 else None,
                    controls=text.controls(answer),
                )
                whole = False
                if finish:
                    break
                if flight is None:
                    if index == 0:
                        prefix.mark_prompt_end(prompt)
                    flight = decoder.launch(request.max_new_tokens - len(tokens), control)
                launched, flight = flight, None  # finished or failed: nothing left to abandon
                result = decoder.finish(launched)
                index += 1
            whole = True
        finally:  # also when the consumer closes the generator between steps (a cancel)
            if flight is not None:  # a stop string or a cancel ended it before the step launched ahead
                whole = whole and self._abandon(decoder, flight)
            self._settle(decoder, prompt + tokens[:-1] if whole else None)
            for method in measuring:
                costs = self.autos[method].costs
                if costs is not None:  # measured by this generation: keep them
                    save_costs(self.costs_paths[method], costs)
        summary = {
            "prompt_tokens": len(prompt),
            "reused_tokens": reused,
            "prefill_tokens": len(prompt) - reused,
            "prefill_seconds": prefill_seconds,
            **stats.summary(),
            "kernels": describe(self.model.device),
            "fallbacks": sorted(fallbacks()),
            "cuda_graphs": self.cuda_graphs(),
            "pipelined": self.pipelined,
            "method": self.method,  # the default; each step's is in stats' by_method
            # host time in the grammar's masks over the decode steps (None: no grammar)
            "grammar_seconds": grammar.seconds - grammar_at_prefill if grammar is not None else None,
        }
        reply_ids = tokens if counted is None else tokens[:counted]  # the cache holds all of `tokens`
        yield FinishEvent(finish, reply_ids, "".join(text.answer), "".join(text.thought), summary)

    def grammar_state(self, grammar: Grammar) -> GrammarState:
        """A matcher for one generation under `grammar`; a finished grammar allows only the end of
        the model's turn (<turn|>, else the tokenizer's end token)."""
        if self.tokenizer is None:
            raise ValueError("a grammar needs the model's tokenizer, and this model folder has none")
        turn_end = self.tokenizer.convert_tokens_to_ids("<turn|>")
        if not isinstance(turn_end, int) or turn_end == self.tokenizer.unk_token_id:
            turn_end = self.tokenizer.eos_token_id
        return GrammarState(vocabulary(self.tokenizer, self.model.cfg.vocab_size, turn_end), grammar, self.model.device)

    @staticmethod
    def _abandon(decoder: Decoder, flight) -> bool:
        """Undo a step launched ahead; whether the state is known again."""
        try:
            decoder.abandon(flight)
            return True
        except Exception:  # noqa: BLE001 - the state is unknown; the next request starts afresh
            return False

    def _settle(self, decoder: Decoder, held: list[int] | None) -> None:
        """Tell the prefix cache what the device state holds after a generation: `held`, once the
        drafter has the last steps' features; nothing it can trust after a failure."""
        if held is not None and self.drafter is not None:
            try:
                decoder.flush_pending()
            except Exception:  # noqa: BLE001 - the state is unknown; the next request starts afresh
                held = None
        assert self._prefix is not None  # generate allocated the step state (_step_state)
        self._prefix.finish(held)


def draft_folders(draft_dir: str | Path | None, assistant_dir: str | Path | None = None) -> dict[str, Path]:
    """{"dflash": folder, "mtp": folder} of what to load: `draft_dir` either kind (by its config),
    `assistant_dir` an MTP assistant beside a drafter."""
    folders: dict[str, Path] = {}
    if draft_dir:
        folders["mtp" if is_assistant_folder(draft_dir) else "dflash"] = Path(draft_dir)
    if assistant_dir:
        if not is_assistant_folder(assistant_dir):
            raise ConfigError(f"{assistant_dir} is not a Gemma 4 MTP assistant (its config.json says otherwise)")
        if "mtp" in folders:
            raise ConfigError("two MTP assistants: give a DFlash drafter as the draft model, the assistant beside it")
        folders["mtp"] = Path(assistant_dir)
    return folders


def _costs_path(
    device: torch.device, model_dir, draft_dir, dtype: torch.dtype, kv: str, draft_quantize: str | None
) -> Path:
    """The file of this card's measured step costs for this model pair and these settings."""
    from flashdesk.paths import data_dir

    card = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu {platform.processor()}"
    key = (
        card,
        str(Path(model_dir).resolve()),
        str(Path(draft_dir).resolve()),
        str(dtype),
        kv,
        str(draft_quantize),
        describe(device),
        torch.__version__,
    )
    return costs_file(data_dir() / "step_costs", *key)


def _share(progress, base: float, share: float):
    """A load_tensors byte callback that reports progress(base .. base + share)."""
    if progress is None:
        return None
    return lambda done, total: progress(base + share * done / max(total, 1))


SMALL_MODEL_BYTES = 64 << 20
DEFAULT_CPU_THREADS = torch.get_num_threads()  # torch's own choice, before any load changes it


def cpu_threads(model_dir: Path) -> int:
    """Threads for torch on the CPU: one for tiny models (demo, tests), where splitting 64-wide
    matmuls costs more than it saves and, on a busy machine, every waiting thread stalls each op;
    all cores otherwise. FLASHDESK_CPU_THREADS overrides."""
    explicit = os.environ.get("FLASHDESK_CPU_THREADS")
    if explicit:
        return max(1, int(explicit))
    size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    return 1 if size < SMALL_MODEL_BYTES else DEFAULT_CPU_THREADS


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but torch sees no CUDA GPU (run `flashdesk doctor`)")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"unknown device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on the GPU (the checkpoint's dtype), fp32 on the CPU (where bf16 matmuls are slow)."""
    table = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}: use auto, bfloat16 or float32")
    return table[dtype]


def resolve_kv_dtype(kv_dtype: str, device: torch.device, model_dtype: torch.dtype) -> str:
    """auto: fp8 on CUDA, the model dtype on the CPU."""
    if kv_dtype == "auto":
        return "fp8" if device.type == "cuda" else str(model_dtype).removeprefix("torch.")
    if kv_dtype not in ("bfloat16", "float32", "fp8"):
        raise ValueError(f"unknown KV dtype {kv_dtype!r}: use auto, bfloat16, float32 or fp8")
    return kv_dtype
