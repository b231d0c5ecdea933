"""The bad-input catalogue: every kind of bad input the engine and the app take from outside, each a
named case that passes when the refusal is the specific one (a distinctive phrase of its message)
and nothing is lost (the engine still answers; the database still holds its rows).

The engine's cases go to one real worker process, as the app's requests would: broken copies of
the demo pair to Load (and to Inspect, the doctor's check, which must name the same problem),
prompts to Generate, and raw lines of the protocol that the app would never write. After every
case the worker must still answer; one that does not is replaced, so the next case is judged on
its own. The database's cases are in reliability_checks/store_inputs.py, those of `flashdesk serve` in
reliability_checks/serve_inputs.py.
"""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from flashdesk import protocol as p
from .common import WorkerGone, WorkerProcess

CONTEXT = 512  # the generate cases' context: small, so an overflow is cheap to make


class Skip(Exception):
    """This machine cannot make the case's bad input (the reason is reported, the case not counted)."""


@dataclass
class Case:
    name: str
    expect: str  # what must happen, in words (the phrase of the error, or the outcome)
    run: Callable[[], str | None]  # None when it passed, else what happened
    engine: bool = False  # the worker must still answer afterwards


@dataclass
class CatalogueFigures:
    tried: int = 0
    passed: int = 0
    failures: list[dict] = field(default_factory=list)  # {"case", "expected", "happened"}
    skipped: list[dict] = field(default_factory=list)  # {"case", "reason"}

    def as_dict(self) -> dict:
        return {"tried": self.tried, "passed": self.passed, "failures": self.failures, "skipped": self.skipped}


class Lab:
    """The demo pair, a folder for broken copies of it, and the worker the engine cases talk to."""

    def __init__(self, demo: tuple[Path, Path], folder: Path):
        self.target, self.drafter = demo
        self.folder = folder
        self._worker: WorkerProcess | None = None
        self.loaded = False  # the worker holds the demo pair at CONTEXT tokens
        self.server_url: str | None = None  # the worker's HTTP server, once started

    def worker(self) -> WorkerProcess:
        if self._worker is None:
            self._worker = WorkerProcess()
            self.loaded, self.server_url = False, None
        return self._worker

    def replace_worker(self) -> None:
        if self._worker is not None:
            self._worker.close()
        self._worker = None

    def close(self) -> None:
        self.replace_worker()

    def load_demo(self) -> None:
        """The demo pair in the worker, for the cases that need a model."""
        if self.loaded:
            return
        w = self.worker()
        w.send(p.Load(str(self.target), str(self.drafter), device="cpu", context=CONTEXT))
        end = w.until((p.Loaded, p.Error))[-1]
        if isinstance(end, p.Error):
            raise WorkerGone(f"the demo pair does not load: {end.message}")
        self.loaded = True

    def copy(self, case: str, part: str) -> Path:
        """A fresh copy of the demo's `part` ("target" or "drafter") to break."""
        source = self.target if part == "target" else self.drafter
        folder = self.folder / case / part
        shutil.copytree(source, folder)
        return folder


# -- what a case checks ------------------------------------------------------------------------------


def refusal(end, phrase: str) -> str | None:
    """None when `end` is a bad-input Error that says `phrase`; else what it was."""
    if not isinstance(end, p.Error):
        return f"no error: the engine answered {end.TYPE}"
    if end.kind != p.BAD_INPUT:
        return f"a {end.kind} error, not bad input: {end.message[:300]}"
    if phrase.lower() not in end.message.lower():
        return f"the error does not say {phrase!r}: {end.message[:300]}"
    return None


def load_refused(lab: Lab, target: Path, drafter: Path | None, phrase: str, doctor: bool | str = True) -> str | None:
    """Load must be refused saying `phrase`, and the doctor's check (Inspect) must name it too: say
    `phrase`, or `doctor` when that is a phrase of its own (False: not checked)."""
    w = lab.worker()
    lab.loaded = False
    w.send(p.Load(str(target), str(drafter) if drafter else None, device="cpu", context=CONTEXT))
    problem = refusal(w.until((p.Loaded, p.Error))[-1], phrase)
    if problem or doctor is False:
        return f"load: {problem}" if problem else None
    w.send(p.Inspect(str(target), str(drafter) if drafter else None, CONTEXT, "cpu"))
    report = w.until((p.Inspected, p.Error))[-1]
    said = [report.message] if isinstance(report, p.Error) else report.problems
    phrase = doctor if isinstance(doctor, str) else phrase
    if not any(phrase.lower() in line.lower() for line in said):
        return f"the doctor's check does not name it: {said}"
    return None


def generate_refused(lab: Lab, line: bytes | p.Generate, phrase: str) -> str | None:
    lab.load_demo()
    w = lab.worker()
    w.send_raw(line if isinstance(line, bytes) else p.encode(line).encode("utf-8"))
    return refusal(w.until((p.Finished, p.Error))[-1], phrase)


def generate_answered(lab: Lab, line: bytes | p.Generate) -> str | None:
    """The turn is answered (a reply of its max_tokens), not refused."""
    lab.load_demo()
    w = lab.worker()
    w.send_raw(line if isinstance(line, bytes) else p.encode(line).encode("utf-8"))
    end = w.until((p.Finished, p.Error))[-1]
    if isinstance(end, p.Error):
        return f"refused: a {end.kind} error: {end.message[:300]}"
    return None if end.token_ids else "an empty reply"


def line_refused(lab: Lab, line: bytes, phrase: str) -> str | None:
    """A raw protocol line must get a bad-input Error (during "request") saying `phrase`."""
    w = lab.worker()
    w.send_raw(line)
    return refusal(w.until(p.Error, 10)[-1], phrase)


# -- breaking copies of the demo pair --------------------------------------------------------------------


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def edit_tensors(folder: Path, change: Callable[[dict], None]) -> None:
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def scribble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:18] = b"\xff" * 10  # the header's first bytes: no longer JSON
    path.write_bytes(bytes(data))


def overstate_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:8] = struct.pack("<Q", len(data) * 4)  # a header longer than the file
    path.write_bytes(bytes(data))


def tensor_renamed(tensors: dict) -> None:
    tensors["model.norm.scale"] = tensors.pop("model.norm.weight")


def _long_talk(turns: int) -> list[dict]:
    talk = []
    for i in range(turns):
        talk += [
            {"role": "user", "content": f"Question {i}: " + "tell me about the weather at sea. " * 6},
            {"role": "assistant", "content": f"Answer {i}: " + "calm and grey. " * 6},
        ]
    return talk + [{"role": "user", "content": "And tomorrow?"}]


def _raw_generate(rid: str, content: bytes) -> bytes:
    """A Generate line whose user content is the bytes given, as they are (escapes, invalid UTF-8)."""
    return (
        (
            f'{{"type":"generate","request_id":"{rid}","max_tokens":4,"ignore_eos":true,'
            '"messages":[{"role":"user","content":'
        ).encode()
        + content
        + b"}]}"
    )


# -- the engine's cases --------------------------------------------------------------------------------


def engine_cases(lab: Lab) -> list[Case]:
    t, d = lab.target, lab.drafter

    def target_case(name: str, phrase: str, breaker: Callable[[Path], None], doctor: bool = True) -> Case:
        def run() -> str | None:
            folder = lab.copy(name, "target")
            breaker(folder)
            return load_refused(lab, folder, d, phrase, doctor)

        return Case(name, f"load refused: {phrase!r}", run, engine=True)

    def drafter_case(name: str, phrase: str, breaker: Callable[[Path], None]) -> Case:
        def run() -> str | None:
            folder = lab.copy(name, "drafter")
            breaker(folder)
            return load_refused(lab, t, folder, phrase)

        return Case(name, f"load refused: {phrase!r}", run, engine=True)

    def config(change: Callable[[dict], None]) -> Callable[[Path], None]:
        return lambda folder: edit_json(folder / "config.json", change)

    def tensors(change: Callable[[dict], None]) -> Callable[[Path], None]:
        return lambda folder: edit_tensors(folder, change)

    def extra_field_loads() -> str | None:
        folder = lab.copy("config_unknown_extra_field", "target")
        edit_json(folder / "config.json", lambda c: c.update({"a_field_from_a_later_transformers": {"x": 1}}))
        w = lab.worker()
        lab.loaded = False
        w.send(p.Load(str(folder), str(d), device="cpu", context=CONTEXT))
        end = w.until((p.Loaded, p.Error))[-1]
        return None if isinstance(end, p.Loaded) else f"refused: {end.message[:300]}"

    missing = lab.folder / "no-such-model"
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    fp8 = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float"},
                "input_activations": {"num_bits": 8, "type": "float"},
            }
        },
    }
    int8 = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "group_size": 32}}
        },
    }
    return [
        # safetensors files
        target_case("safetensors_truncated", "truncated", lambda f: truncate(f / "model.safetensors")),
        drafter_case("drafter_safetensors_truncated", "truncated", lambda f: truncate(f / "model.safetensors")),
        target_case(
            "safetensors_corrupt_header",
            "corrupt safetensors header",
            lambda f: scribble_header(f / "model.safetensors"),
        ),
        target_case(
            "safetensors_header_longer_than_file",
            "truncated safetensors file (header of",
            lambda f: overstate_header(f / "model.safetensors"),
        ),
        target_case(
            "safetensors_misnamed_file",
            "no model.safetensors.index.json and no model.safetensors",
            lambda f: (f / "model.safetensors").rename(f / "model.safetensor"),
        ),
        target_case("safetensors_misnamed_tensor", "missing tensor norm.weight", tensors(tensor_renamed)),
        target_case(
            "tensor_wrong_shape",
            "has shape [16, 128], expected [64, 128]",
            tensors(
                lambda ts: ts.update(
                    {"model.layers.2.self_attn.k_proj.weight": ts["model.norm.weight"].new_zeros(16, 128)}
                )
            ),
        ),
        target_case(
            "tensor_wrong_dtype",
            "has dtype I32",
            tensors(lambda ts: ts.update({"model.norm.weight": ts["model.norm.weight"].int()})),
        ),
        # configs
        target_case("config_not_json", "is not valid JSON", lambda f: (f / "config.json").write_text("{not json")),
        target_case("config_missing", "model config not found", lambda f: (f / "config.json").unlink()),
        target_case("config_missing_field", "'hidden_size' is missing", config(lambda c: c.pop("hidden_size"))),
        target_case(
            "config_unknown_architecture",
            "is not a Gemma 4 target",
            config(lambda c: c.update(architectures=["LlamaForCausalLM"])),
        ),
        target_case(
            "config_unknown_rope_type",
            "rope_type 'yarn'",
            config(lambda c: c["rope_parameters"]["full_attention"].update(rope_type="yarn")),
        ),
        target_case(
            "config_unsupported_activation", "activation 'silu'", config(lambda c: c.update(hidden_activation="silu"))
        ),
        target_case("config_unsupported_kv_sharing", "KV sharing", config(lambda c: c.update(num_kv_shared_layers=2))),
        Case(
            "config_unknown_extra_field",
            "loads: fields it does not know are ignored, as transformers does",
            extra_field_loads,
            engine=True,
        ),
        # drafters that do not belong to this target
        drafter_case(
            "drafter_other_hidden_size",
            "does not match the target model: hidden size 256",
            config(lambda c: c.update(hidden_size=256)),
        ),
        drafter_case("drafter_other_vocabulary", "vocabulary 8192", config(lambda c: c.update(vocab_size=8192))),
        drafter_case(
            "drafter_taps_missing_layer",
            "name layer 9",
            config(lambda c: c["dflash_config"].update(target_layer_ids=[1, 3, 9])),
        ),
        drafter_case(
            "drafter_dflash2", "DFlash2 drafters", config(lambda c: c.update(architectures=["DFlash2DraftModel"]))
        ),
        drafter_case(
            "drafter_not_a_drafter",
            "is not a DFlash drafter",
            config(lambda c: c.update(architectures=["Qwen3ForCausalLM"])),
        ),
        # quantization
        target_case(
            "quantization_gptq",
            "quant_method 'gptq' is not supported",
            config(lambda c: c.update(quantization_config=gptq)),
        ),
        target_case("quantization_fp8_activations", "activations", config(lambda c: c.update(quantization_config=fp8))),
        target_case("quantization_int8", "8-bit weights", config(lambda c: c.update(quantization_config=int8))),
        # folders
        # (the doctor only warns of this: `generate --prompt-ids` runs without a tokenizer)
        target_case("tokenizer_missing", "has no tokenizer", lambda f: (f / "tokenizer.json").unlink(), doctor=False),
        Case(
            "model_folder_missing",
            "load refused: 'model config not found' (the doctor: 'is not a folder')",
            lambda: load_refused(lab, missing, None, "model config not found", "is not a folder"),
            engine=True,
        ),
        Case(
            "model_hub_id_not_downloaded",
            "load refused: 'no Hub model of that name'",
            lambda: load_refused(lab, Path("nobody-here/no-such-model"), None, "no Hub model of that name"),
            engine=True,
        ),
        # prompts
        Case(
            "context_overflow",
            "refused under the 'stop' policy: 'over the context of 512 tokens'",
            lambda: generate_refused(
                lab,
                p.Generate("overflow", _long_talk(8), max_tokens=40, context_policy="stop"),
                f"over the context of {CONTEXT} tokens",
            ),
            engine=True,
        ),
        Case(
            "message_longer_than_context",
            "refused: 'Shorten the message'",
            lambda: generate_refused(
                lab,
                p.Generate("long", [{"role": "user", "content": "word " * 2000}], max_tokens=8),
                "Shorten the message",
            ),
            engine=True,
        ),
        Case(
            "prompt_control_characters",
            "answered: NUL, escape, bell and DEL are text like any other",
            lambda: generate_answered(
                lab,
                p.Generate(
                    "ctrl",
                    [{"role": "user", "content": "hi\x00 \x1b[31mred\x1b[0m \x07\x7f\x08 \r\n end"}],
                    max_tokens=4,
                    ignore_eos=True,
                ),
            ),
            engine=True,
        ),
        Case(
            "prompt_invalid_utf8",
            "answered: bytes that are not UTF-8 arrive as U+FFFD",
            lambda: generate_answered(lab, _raw_generate("utf8", b'"caf\xc3 \xff\xfe bytes"')),
            engine=True,
        ),
        Case(
            "prompt_lone_surrogate",
            "refused: 'not valid Unicode'",
            lambda: generate_refused(lab, _raw_generate("surrogate", b'"half a pair: \\ud800"'), "not valid Unicode"),
            engine=True,
        ),
        Case(
            "sampling_negative_temperature",
            "refused: 'temperature must be >= 0'",
            lambda: generate_refused(
                lab,
                p.Generate("temp", [{"role": "user", "content": "hi"}], temperature=-1.0),
                "temperature must be >= 0",
            ),
            engine=True,
        ),
        Case(
            "sampling_zero_max_tokens",
            "refused: 'at least 1'",
            lambda: generate_refused(
                lab, p.Generate("zero", [{"role": "user", "content": "hi"}], max_tokens=0), "at least 1"
            ),
            engine=True,
        ),
        Case(
            "unknown_context_policy",
            "refused: 'unknown context policy'",
            lambda: generate_refused(
                lab,
                p.Generate("policy", [{"role": "user", "content": "hi"}], context_policy="sideways"),
                "unknown context policy",
            ),
            engine=True,
        ),
    ] + protocol_cases(lab)


def protocol_cases(lab: Lab) -> list[Case]:
    """Lines on the worker's input that the app never writes: each refused as a bad request."""

    def line(name: str, raw: bytes, phrase: str) -> Case:
        return Case(name, f"refused: {phrase!r}", lambda: line_refused(lab, raw, phrase), engine=True)

    hello = '[{"role":"user","content":"hi"}]'
    return [
        line("protocol_not_json", b"this is not a message", "not JSON"),
        line("protocol_binary_garbage", b"\xff\xfe\x00\x9c binary \xc3", "not JSON"),
        line("protocol_truncated_line", b'{"type":"generate","request_id":"x","messa', "not JSON"),
        line("protocol_json_array", b"[1, 2, 3]", "unknown message"),
        line("protocol_unknown_type", b'{"type":"teleport"}', "unknown message"),
        line("protocol_event_as_request", p.encode(p.Unloaded()).encode(), "does not take unloaded"),
        line("protocol_missing_field", b'{"type":"cancel"}', "lacks request_id"),
        line(
            "protocol_messages_not_a_list",
            b'{"type":"generate","request_id":"m","messages":"hello"}',
            "messages must be",
        ),
        line(
            "protocol_max_tokens_not_a_number",
            f'{{"type":"generate","request_id":"t","messages":{hello},"max_tokens":"ten"}}'.encode(),
            "max_tokens must be",
        ),
        line(
            "protocol_message_content_not_text",
            b'{"type":"generate","request_id":"c","messages":[{"role":"user","content":5}]}',
            "content",
        ),
        line(
            "protocol_draft_length_not_a_number",
            b'{"type":"set_speculation","enabled":true,"draft_length":"many"}',
            "draft_length",
        ),
        line("protocol_request_id_not_text", b'{"type":"cancel","request_id":["x"]}', "request_id must be"),
        line("protocol_deeply_nested", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ]


# -- running the catalogue ------------------------------------------------------------------------------


def run_catalogue(cases: list[Case], lab: Lab, log) -> CatalogueFigures:
    figures = CatalogueFigures()
    for case in cases:
        try:
            happened = case.run()
        except Skip as exc:
            figures.skipped.append({"case": case.name, "reason": str(exc)})
            log(f"input {case.name}: skipped ({exc})")
            continue
        except WorkerGone as exc:
            happened = str(exc)
        except Exception as exc:  # noqa: BLE001 - a case that breaks the harness is a failed case, said
            happened = f"{type(exc).__name__}: {exc}"
        if case.engine and not lab.worker().answers():
            happened = (happened + "; " if happened else "") + "the worker stopped answering"
            lab.replace_worker()
        figures.tried += 1
        if happened is None:
            figures.passed += 1
        else:
            figures.failures.append({"case": case.name, "expected": case.expect, "happened": happened})
        log(f"input {case.name}: " + ("passed" if happened is None else f"FAILED: {happened}"))
    return figures
