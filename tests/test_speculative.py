"""DFlash speculative decoding: step for step identical to z-lab's reference loop, and lossless."""

import json
import time

import pytest
import torch

from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest, StepEvent
from flashdesk.engine.decode.speculative import SpecControl
from tiny_checkpoints import TINY_TEXT_CONFIG
from tiny_drafter import PROMPTS, TINY_DRAFT_CONFIG

dflash_model = pytest.importorskip("dflash.model", reason="z-lab's dflash is a test dependency")


def reference_trace(pair, prompt, max_new, k):
    """Run z-lab's dflash_generate and read its steps off the target's verify calls."""
    _, _, ref_target, ref_drafter = pair
    calls = []
    forward = ref_target.forward

    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        calls.append(((args[0] if args else kwargs["input_ids"])[0].clone(), out.logits[0].clone()))
        return out

    ref_target.forward = spy
    cuda_time = dflash_model._cuda_time
    dflash_model._cuda_time = time.perf_counter  # its timer syncs CUDA; we are on the CPU
    try:
        result = dflash_model.dflash_generate(
            ref_drafter, ref_target, torch.tensor([prompt]), max_new, [1, 106, 50], block_size=k + 1, return_stats=True
        )
    finally:
        del ref_target.forward
        dflash_model._cuda_time = cuda_time
    output = result.output_ids[0, len(prompt) :].tolist()
    steps, at = [], 1  # the first token comes from the prefill
    for (block, logits), produced in zip(calls[1:], result.acceptance_lengths):
        accepted = int((block[1:] == logits.argmax(-1)[:-1]).int().cumprod(0).sum())
        steps.append((block[1:].tolist(), accepted, output[at : at + produced]))
        at += produced
    return output, steps


def our_trace(engine, prompt, max_new, control, **kwargs):
    events = list(engine.generate(GenerationRequest(prompt, max_new, **kwargs), control))
    steps = [(e.draft, e.accepted, e.emitted) for e in events if isinstance(e, StepEvent) and e.index > 0]
    return events[-1], steps


@pytest.mark.parametrize("k", [1, 3, 7, 15])
@pytest.mark.parametrize("prompt", PROMPTS, ids=["chat", "short", "long"])
def test_every_step_equals_the_reference_loop(spec_pair, prompt, k):
    """Drafted ids, accepted count and emitted ids of every step, over runs past both sliding windows."""
    engine = spec_pair[0]
    max_new = 48
    assert len(prompt) + max_new > 2 * max(TINY_TEXT_CONFIG["sliding_window"], TINY_DRAFT_CONFIG["sliding_window"])
    expected_output, expected_steps = reference_trace(spec_pair, prompt, max_new, k)
    finish, steps = our_trace(engine, prompt, max_new, SpecControl(True, k))
    assert finish.token_ids == expected_output
    assert steps == expected_steps
    assert any(accepted > 0 for _, accepted, _ in steps)  # the trained drafter does get tokens accepted


@pytest.mark.parametrize("prompt", PROMPTS, ids=["chat", "short", "long"])
def test_greedy_output_with_speculation_equals_without(spec_pair, prompt):
    engine = spec_pair[0]
    plain, _ = our_trace(engine, prompt, 40, SpecControl(enabled=False))
    for k in range(1, 16):
        spec, steps = our_trace(engine, prompt, 40, SpecControl(True, k))
        assert spec.token_ids == plain.token_ids, k
        assert all(len(draft) <= k for draft, _, _ in steps)


def test_toggling_and_changing_k_mid_generation_stays_exact(spec_pair):
    """The control is read at every step: flip it while the generator runs."""
    engine = spec_pair[0]
    prompt, max_new = PROMPTS[0], 120
    plain, _ = our_trace(engine, prompt, max_new, SpecControl(enabled=False))
    control = SpecControl(True, 4)
    schedule = {2: (False, 4), 5: (True, 15), 8: (True, 1), 10: (False, 1), 12: (True, 6)}
    setting, tokens, seen = (True, 4), [], []
    for event in engine.generate(GenerationRequest(prompt, max_new), control):
        if isinstance(event, FinishEvent):
            break
        if event.index:
            enabled, k = setting
            assert len(event.draft) == (min(k, max_new - len(tokens)) if enabled else 0), event.index
            seen.append(event.index)
        tokens += event.emitted
        if event.index in schedule:
            setting = schedule[event.index]
            control.enabled, control.draft_length = setting
    assert tokens == plain.token_ids
    assert max(seen) > 12  # every change in the schedule was exercised


def test_block_shrinks_at_max_tokens_and_nothing_leaks(spec_pair):
    engine = spec_pair[0]
    for max_new in (1, 2, 5, 17):
        finish, steps = our_trace(engine, PROMPTS[1], max_new, SpecControl(True, 15), ignore_eos=True)
        assert len(finish.token_ids) == max_new
        assert all(len(draft) <= max_new - 1 for draft, _, _ in steps)


def cli_json(capsys, *argv):
    from flashdesk.engine.cli.main import main

    assert main(["generate", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_cli_reports_drafts_and_acceptance(spec_pair, capsys):
    target_dir, draft_dir = spec_pair[1]
    prompt = ",".join(map(str, PROMPTS[0]))
    plain = cli_json(capsys, "--model", target_dir, "--prompt-ids", prompt, "--max-new-tokens", 40)
    spec = cli_json(
        capsys,
        "--model",
        target_dir,
        "--draft",
        draft_dir,
        "--prompt-ids",
        prompt,
        "--max-new-tokens",
        40,
        "--draft-length",
        5,
    )
    assert spec["token_ids"] == plain["token_ids"]
    assert all(len(s["draft"]) <= 5 and 0 <= s["accepted"] <= len(s["draft"]) for s in spec["steps"])
    assert [t for s in spec["steps"] for t in s["emitted"]] == spec["token_ids"][1:]
    stats = spec["stats"]
    drafted = sum(len(s["draft"]) for s in spec["steps"])
    accepted = sum(s["accepted"] for s in spec["steps"])
    assert stats["acceptance_rate"] == pytest.approx(accepted / drafted)
    assert stats["mean_acceptance_length"] == pytest.approx((len(spec["token_ids"]) - 1) / len(spec["steps"]))
    assert len(stats["per_position_acceptance"]) == 5
    off = cli_json(
        capsys,
        "--model",
        target_dir,
        "--draft",
        draft_dir,
        "--prompt-ids",
        prompt,
        "--max-new-tokens",
        40,
        "--no-speculate",
    )
    assert off["token_ids"] == plain["token_ids"] and all(s["draft"] == [] for s in off["steps"])
    assert off["stats"]["acceptance_rate"] is None


def test_cli_refuses_bad_draft_options(spec_pair, capsys):
    from flashdesk.engine.cli.main import main

    target_dir, draft_dir = spec_pair[1]
    assert (
        main(
            [
                "generate",
                "--model",
                str(target_dir),
                "--draft",
                str(draft_dir),
                "--prompt-ids",
                "2,3",
                "--draft-length",
                "16",
            ]
        )
        == 2
    )
    assert "--draft-length must be 1..15" in capsys.readouterr().err
    assert main(["generate", "--model", str(target_dir), "--prompt-ids", "2,3", "--no-speculate"]) == 2
    assert "need --draft" in capsys.readouterr().err


def test_long_stretches_without_speculation_fold_features_in_early(spec_pair, monkeypatch):
    """With speculation off the target's features are folded into the drafter's context every few
    steps (bounded memory), and switching it back on later is still exact."""
    import flashdesk.engine.decode.speculative as speculative

    monkeypatch.setattr(speculative, "PENDING_LIMIT", 4)
    engine = spec_pair[0]
    prompt, max_new = PROMPTS[1], 60
    plain, _ = our_trace(engine, prompt, max_new, SpecControl(enabled=False))
    control = SpecControl(False, 5)
    tokens, accepted = [], 0
    for event in engine.generate(GenerationRequest(prompt, max_new), control):
        if isinstance(event, FinishEvent):
            break
        tokens += event.emitted
        accepted += event.accepted
        if event.index == 20:
            control.enabled = True
    assert tokens == plain.token_ids
    assert accepted > 0  # the drafter's context was complete: its drafts still get accepted


def test_loading_reports_progress_through_the_weights(spec_pair):
    from flashdesk.engine.decode.generation import Engine

    target_dir, draft_dir = spec_pair[1]
    seen = []
    Engine.load(target_dir, device="cpu", draft_dir=draft_dir, progress=seen.append)
    assert len(seen) > 20  # one report per tensor read
    assert seen == sorted(seen) and 0 < seen[0] < 0.1
    assert seen[-1] == pytest.approx(1.0)
    assert any(0.9 < f < 0.96 for f in seen)  # the target ends at 95%, the drafter takes the rest


def test_suppressed_tokens_are_never_emitted_as_transformers_suppresses_them(spec_pair, monkeypatch):
    """generation_config.json's suppress_tokens: greedy output equals transformers' generate with
    the same suppress_tokens (its tokens masked at every step), with speculation on and off; the
    drafter's proposals of them are rejected."""
    engine, _, reference, _ = spec_pair
    prompt = PROMPTS[0]
    free, _ = our_trace(engine, prompt, 24, SpecControl(enabled=False), ignore_eos=True)
    suppress = tuple(sorted(set(free.token_ids[:6])))  # what it would have said first
    with torch.no_grad():
        seq = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=24,
            do_sample=False,
            suppress_tokens=list(suppress),
            eos_token_id=None,
            pad_token_id=0,
        )
    want = seq[0, len(prompt) :].tolist()
    monkeypatch.setattr(engine, "suppress_tokens", suppress)
    plain, _ = our_trace(engine, prompt, 24, SpecControl(enabled=False), ignore_eos=True)
    assert plain.token_ids == want and not set(want) & set(suppress)
    for k in (3, 15):
        assert our_trace(engine, prompt, 24, SpecControl(True, k), ignore_eos=True)[0].token_ids == want


def test_suppress_tokens_are_read_from_the_generation_config(tmp_path):
    from flashdesk.engine.loading.model_card import suppress_tokens

    (tmp_path / "generation_config.json").write_text(json.dumps({"suppress_tokens": [7, 3, 7]}))
    assert suppress_tokens(tmp_path, 512) == (3, 7)
    (tmp_path / "generation_config.json").write_text(json.dumps({"suppress_tokens": [3, 9999]}))
    with pytest.raises(ValueError, match="suppress_tokens must be a list of token ids in 0..511"):
        suppress_tokens(tmp_path, 512)
    (tmp_path / "generation_config.json").write_text("{}")
    assert suppress_tokens(tmp_path, 512) == ()


def test_recommended_sampling_is_read_within_its_ranges(tmp_path):
    """generation_config.json's sampling, as the window and serve start from it: greedy when
    do_sample is false, and a value out of its range (or a boolean) left out rather than failing
    every request that does not name it."""
    from flashdesk.engine.loading.model_card import sampling_defaults

    config = tmp_path / "generation_config.json"
    config.write_text(json.dumps({"temperature": 1.0, "top_p": 0.95, "top_k": 64}))
    assert sampling_defaults(tmp_path) == {"temperature": 1.0, "top_p": 0.95, "top_k": 64}
    config.write_text(json.dumps({"temperature": 7, "top_p": 0, "top_k": True, "do_sample": True}))
    assert sampling_defaults(tmp_path) == {}
    config.write_text(json.dumps({"do_sample": False, "temperature": 0.7}))
    assert sampling_defaults(tmp_path) == {"temperature": 0.0}
    config.write_text("[1, 2]")
    assert sampling_defaults(tmp_path) == {}
