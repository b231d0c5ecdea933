"""`flashdesk bench`: AR and DFlash at several draft lengths, measured side by side in one run.

Every mode decodes the same prompts with the same settings in the same process, so the ratios
(speedup over AR, our speed over transformers' generate and over z-lab's reference loop) compare
like with like on this machine. Absolute numbers depend on the card; the ratios are the point.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flashdesk.engine.decode.chat import build_prompt_ids, messages_from
from flashdesk.engine.errors import FlashDeskError
from flashdesk.engine.decode.generation import Engine, FinishEvent, GenerationRequest
from flashdesk.engine.decode.speculative import SpecControl

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "bench_prompts.jsonl"


@dataclass
class ModeResult:
    """Totals of one mode over all prompts."""

    name: str
    draft_length: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    speculative_steps: int = 0
    speculative_emitted: int = 0
    per_prompt: list = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def as_dict(self, baseline: float | None) -> dict:
        tps = self.tokens_per_second
        return {
            "mode": self.name, "draft_length": self.draft_length, "decode_tokens": self.decode_tokens,
            "decode_seconds": self.decode_seconds, "tokens_per_second": tps,
            "speedup_over_ar": tps / baseline if baseline else None,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "mean_acceptance_length": (self.speculative_emitted / self.speculative_steps
                                       if self.speculative_steps else None),
            "per_prompt": self.per_prompt,
        }


def load_prompts(path: str | Path | None) -> list[dict]:
    """JSON lines with "prompt" (and optional "category"), or plain text, one prompt per line."""
    path = Path(path) if path else DEFAULT_PROMPTS
    if not path.is_file():
        raise FlashDeskError(f"prompts file not found: {path}")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                item = json.loads(line)
                prompts.append({"prompt": str(item["prompt"]), "category": str(item.get("category", "other"))})
            except (ValueError, KeyError) as exc:
                raise FlashDeskError(f"{path}:{number}: not a JSON object with a \"prompt\": {exc}") from exc
        else:
            prompts.append({"prompt": line, "category": "other"})
    if not prompts:
        raise FlashDeskError(f"{path} holds no prompts")
    return prompts


def mode_name(draft_length: int) -> str:
    return "AR" if draft_length == 0 else f"DFlash K={draft_length}"


def run_ours(engine: Engine, ids: list[int], max_new: int, result: ModeResult) -> None:
    """Decode one prompt greedily in one mode (draft length 0 = plain AR) and add up its steps."""
    control = SpecControl(enabled=result.draft_length > 0, draft_length=result.draft_length or None)
    finish = [e for e in engine.generate(GenerationRequest(ids, max_new), control) if isinstance(e, FinishEvent)][0]
    s = finish.stats
    result.decode_tokens += s["decode_tokens"]
    result.decode_seconds += s["decode_seconds"]
    result.drafted += s["drafted"]
    result.accepted += s["accepted"]
    result.speculative_steps += s["speculative_steps"]
    result.speculative_emitted += s["speculative_emitted"]
    result.per_prompt.append({"tokens": len(finish.token_ids), "decode_tokens_per_second":
                              s["decode_tokens_per_second"], "acceptance_rate": s["acceptance_rate"],
                              "token_ids": finish.token_ids})


def _sync(device) -> float:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def reference_models(model_dir: str, draft_dir: str, device, dtype):
    """transformers' Gemma 4 and z-lab's DFlashDraftModel on the same files (for --compare)."""
    import transformers

    try:
        from dflash.model import DFlashDraftModel
    except ImportError:
        raise FlashDeskError("--compare needs z-lab's reference: pip install --no-deps dflash==0.1.0") from None
    config = json.loads((Path(model_dir) / "config.json").read_text())
    cls = getattr(transformers, config["architectures"][0])
    target = cls.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    drafter = DFlashDraftModel.from_pretrained(draft_dir, dtype=dtype).to(device).eval()
    # dflash's loop embeds without Gemma's sqrt(hidden); tell it, as vLLM and mlx do for Gemma targets
    drafter.config.dflash_config = dict(getattr(drafter.config, "dflash_config", {}) or {},
                                        input_embedding_scale=math.sqrt(drafter.config.hidden_size))
    return target, drafter


def run_transformers(target, ids: list[int], max_new: int, stop: list[int], result: ModeResult) -> None:
    """transformers' greedy generate: decode time = the whole call minus a 1-token call (the prefill)."""
    device = target.device
    x = torch.tensor([ids], device=device)
    with torch.inference_mode():
        t0 = _sync(device)
        target.generate(x, max_new_tokens=1, do_sample=False, eos_token_id=stop, pad_token_id=0)
        t1 = _sync(device)
        seq = target.generate(x, max_new_tokens=max_new, do_sample=False, eos_token_id=stop, pad_token_id=0)
        t2 = _sync(device)
    result.decode_tokens += seq.shape[1] - len(ids) - 1  # all but the prefill's token
    result.decode_seconds += max((t2 - t1) - (t1 - t0), 1e-9)


def run_reference(target, drafter, ids: list[int], max_new: int, stop: list[int], result: ModeResult) -> None:
    """z-lab's dflash_generate; its own timer starts after the prefill."""
    import dflash.model as dflash_model

    res = dflash_model.dflash_generate(drafter, target, torch.tensor([ids], device=target.device), max_new, stop,
                                       block_size=result.draft_length + 1, return_stats=True)
    result.decode_tokens += res.num_output_tokens - 1
    result.decode_seconds += res.time_per_output_token * res.num_output_tokens


def run_bench(args) -> int:
    engine = Engine.load(args.model, args.device, args.dtype, args.kv_dtype, None, args.draft,
                         draft_quantize=getattr(args, "draft_quantize", None))
    if engine.tokenizer is None:
        raise FlashDeskError(f"{args.model} has no tokenizer: bench needs one to apply the chat template")
    longest = engine.drafter.max_draft_length
    lengths = [int(k) for k in str(args.draft_lengths).split(",") if k.strip()]
    bad = [k for k in lengths if not 1 <= k <= longest]
    if bad:
        raise ValueError(f"--draft-lengths: {bad[0]} is outside 1..{longest} for this drafter")
    items = load_prompts(args.prompts)
    prompts = [build_prompt_ids(engine.tokenizer, messages_from(p["prompt"]), enable_thinking=False)
               for p in items]
    modes = [ModeResult(mode_name(k), k) for k in [0, *lengths]]
    runs = [(m, lambda ids, m: run_ours(engine, ids, args.max_new_tokens, m)) for m in modes]
    references = []
    if args.compare:
        target, drafter = reference_models(args.model, args.draft, engine.model.device, engine.model.dtype)
        if engine.model.device.type != "cuda":
            import dflash.model as dflash_model

            dflash_model._cuda_time = time.perf_counter  # its timer calls torch.cuda.synchronize
        stop = sorted(engine.eos)
        references = [ModeResult("transformers generate (AR)", 0)] + [
            ModeResult(f"z-lab dflash_generate K={k}", k) for k in lengths]
        runs.append((references[0], lambda ids, m: run_transformers(target, ids, args.max_new_tokens, stop, m)))
        runs += [(m, lambda ids, m: run_reference(target, drafter, ids, args.max_new_tokens, stop, m))
                 for m in references[1:]]
    for result, run in runs:  # warm-up into throwaway results: first-call costs stay out of the numbers
        run(prompts[0][:8], ModeResult(result.name, result.draft_length))
    for ids in prompts:  # every mode on one prompt before the next: drift in machine load hits all alike
        for result, run in runs:
            run(ids, result)
    baseline = modes[0].tokens_per_second
    report = {
        "model": str(args.model), "draft": str(args.draft), "prompts": len(prompts),
        "categories": [p["category"] for p in items], "max_new_tokens": args.max_new_tokens,
        "device": str(engine.model.device), "dtype": str(engine.model.dtype).removeprefix("torch."),
        "kv_dtype": engine.kv_dtype, "modes": [m.as_dict(baseline) for m in modes],
    }
    report["outputs_identical"] = all(m.per_prompt[i]["token_ids"] == modes[0].per_prompt[i]["token_ids"]
                                      for m in modes for i in range(len(prompts)))
    if references:
        ours = {m.draft_length: m.tokens_per_second for m in modes}
        report["compare"] = {
            ("transformers_ar" if i == 0 else f"zlab_dflash_k{m.draft_length}"):
                {"tokens_per_second": m.tokens_per_second, "ours_over_it": ours[m.draft_length] / m.tokens_per_second}
            for i, m in enumerate(references)}
    print(json.dumps(report) if args.json else format_report(report))
    return 0


def format_report(report: dict) -> str:
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = [f"FlashDesk bench: {report['prompts']} prompts x up to {report['max_new_tokens']} new tokens, greedy, "
             f"{report['device']}, {report['dtype']}, KV {report['kv_dtype']}",
             f"{'mode':<14}{'tok/s':>10}{'speedup':>10}{'accept':>9}{'mean acc len':>14}"]
    for m in report["modes"]:
        lines.append(f"{m['mode']:<14}{m['tokens_per_second']:>10.1f}{fmt(m['speedup_over_ar'], '.2f') + 'x':>10}"
                     f"{fmt(m['acceptance_rate'], '.0%'):>9}{fmt(m['mean_acceptance_length'], '.2f'):>14}")
    lines.append("outputs identical across modes: " + ("yes" if report["outputs_identical"] else
                                                       "NO (speculation changed the output: a bug)"))
    for name, c in report.get("compare", {}).items():
        label = "transformers generate (AR)" if name == "transformers_ar" else \
            f"z-lab dflash_generate K={name.removeprefix('zlab_dflash_k')}"
        lines.append(f"{label:<34}{c['tokens_per_second']:>10.1f} tok/s   ours / it = {c['ours_over_it']:.2f}x")
    return "\n".join(lines)
