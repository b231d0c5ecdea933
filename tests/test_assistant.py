"""Gemma 4's MTP assistant, one draft step at a time, against transformers' Gemma4AssistantForCausalLM
on the same target K/V, embedding and hidden state: both head modes (the tied head, and ordered
embeddings over the top centroids), a sliding window shorter than the K/V given; and what a loader
must refuse."""

import json

import pytest
import torch
import torch.nn.functional as F

from flashdesk.engine.errors import ConfigError
from flashdesk.engine.loading.build import load_assistant, load_target
from flashdesk.engine.model.assistant import parse_assistant_config
from flashdesk.engine.model.config import FULL, SLIDING
from tiny_assistant import write_assistant, write_echo_assistant
from tiny_checkpoints import write_checkpoint

pytest.importorskip("transformers.models.gemma4_assistant")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    reference = write_checkpoint(folder, "causal", seed=3, tokenizer=False, enable_moe_block=False)
    return load_target(folder), reference


@pytest.fixture(scope="module", params=[False, True], ids=["tied-head", "ordered-embeddings"])
def assistant(request, tmp_path_factory, target):
    folder = tmp_path_factory.mktemp("assistant")
    reference = write_assistant(folder, seed=7, ordered=request.param)
    return folder, load_assistant(folder, target[0]), reference


def _shared(ours_target, positions: int, seed: int):
    """Random K/V of the target's last sliding and last full layer, [positions, heads, dim] (ours)
    and [1, heads, positions, dim] (transformers')."""
    gen = torch.Generator().manual_seed(seed)
    kv = {}
    for kind in (SLIDING, FULL):
        spec = [layer for layer in ours_target.cfg.layers if layer.kind == kind][-1]
        k, v = (torch.randn(positions, spec.num_kv_heads, spec.head_dim, generator=gen) for _ in range(2))
        kv[kind] = (k, v)
    theirs = {kind: (k.permute(1, 0, 2)[None], v.permute(1, 0, 2)[None]) for kind, (k, v) in kv.items()}
    return kv, theirs


@pytest.mark.parametrize("positions", [5, 20])  # fewer and more than the sliding window of 8
def test_a_draft_step_matches_transformers(target, assistant, positions):
    ours_target, reference_target = target
    _, ours, reference = assistant
    kv, theirs = _shared(ours_target, positions, seed=positions)
    hidden = torch.randn(1, ours_target.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    token = torch.tensor([37])
    embedding = F.embedding(token, ours_target.embed) * ours_target.embed_scale
    with torch.no_grad():
        their_embedding = reference_target.get_input_embeddings()(token[None])
        out = reference(
            inputs_embeds=torch.cat([their_embedding, hidden[None]], dim=-1),
            position_ids=torch.tensor([[positions - 1]]),
            shared_kv_states=theirs,
            attention_mask=None,
        )
    assert torch.equal(embedding, their_embedding[0])
    logits, next_hidden = ours.step(embedding, hidden, ours.attend_over(kv), positions - 1)
    assert logits.argmax() == out.logits[0, -1].argmax()
    torch.testing.assert_close(logits[0], out.logits[0, -1].float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(next_hidden[0], out.last_hidden_state[0, -1], rtol=1e-4, atol=1e-4)


def test_a_config_that_is_not_all_shared_or_has_experts_is_refused(assistant):
    folder = assistant[0]
    raw = json.loads((folder / "config.json").read_text())
    assert parse_assistant_config(raw).backbone_hidden_size == 64
    half = dict(raw, text_config=dict(raw["text_config"], num_kv_shared_layers=1))
    with pytest.raises(ConfigError, match="every assistant layer must reuse the target's K/V"):
        parse_assistant_config(half)
    with pytest.raises(ConfigError, match="MoE"):
        parse_assistant_config(dict(raw, text_config=dict(raw["text_config"], enable_moe_block=True)))
    with pytest.raises(ConfigError, match="not a Gemma 4 assistant"):
        parse_assistant_config(dict(raw, model_type="qwen3", architectures=["Qwen3ForCausalLM"]))


def test_an_assistant_for_another_target_is_refused(assistant, tmp_path):
    other = tmp_path / "other"
    write_checkpoint(other, "causal", seed=1, tokenizer=False, enable_moe_block=False, hidden_size=32)
    with pytest.raises(ConfigError, match="width 64"):
        load_assistant(assistant[0], load_target(other))


def test_models_verify_reads_an_assistant_and_names_what_is_missing(assistant, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from flashdesk.engine.hub.models import model_kind
    from flashdesk.engine.hub.verify import verify

    folder = assistant[0]
    assert model_kind(folder) == "assistant"
    result = verify(str(folder))
    assert result.ok and result.kind == "assistant", result.problems
    assert "Gemma 4 MTP, 2 layers of width 48, for a target of width 64" in "\n".join(result.lines)
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["pre_projection.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    result = verify(str(broken))
    assert not result.ok and "missing tensor pre_projection.weight" in result.problems[0]


# --- rounds: the assistant's drafts and the accepted counts, as transformers' assisted decoding ----------


def _their_rounds(reference_target, reference_assistant, prompt, new_tokens, k):
    """transformers' greedy assisted generation with the assistant drafting k tokens a round: the
    tokens, and each round's drafts (recorded from the candidate generator)."""
    from transformers.generation import candidate_generator

    drafted = []
    real = candidate_generator.SinglePositionMultiTokenCandidateGenerator.get_candidates

    def record(self, input_ids, *args, **kwargs):
        ids, logits = real(self, input_ids, *args, **kwargs)
        if logits is not None:
            drafted.append((input_ids.shape[1], ids[0, input_ids.shape[1] :].tolist()))
        return ids, logits

    reference_assistant.generation_config.num_assistant_tokens = k
    reference_assistant.generation_config.num_assistant_tokens_schedule = "constant"
    candidate_generator.SinglePositionMultiTokenCandidateGenerator.get_candidates = record
    try:
        with torch.no_grad():
            seq = reference_target.generate(
                torch.tensor([prompt]),
                assistant_model=reference_assistant,
                max_new_tokens=new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0].tolist()
    finally:
        candidate_generator.SinglePositionMultiTokenCandidateGenerator.get_candidates = real
    return seq[len(prompt) :], drafted


@pytest.fixture(scope="module")
def moe_pair(tmp_path_factory):
    """A tiny MoE target (as the real one) and an assistant for it, as folders, and transformers' models."""
    folder, assistant_folder = tmp_path_factory.mktemp("moe-target"), tmp_path_factory.mktemp("moe-assistant")
    reference = write_checkpoint(folder, "causal", seed=5, tokenizer=False)
    their_assistant = write_echo_assistant(assistant_folder, reference, seed=11)
    return folder, assistant_folder, reference, their_assistant


PROMPT = [2, 17, 91, 33, 250, 7, 7, 64, 301, 12, 5, 88]  # longer than the sliding window of 8


def _plain_greedy(reference, prompt, new_tokens):
    with torch.no_grad():
        out = reference.generate(
            torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def _generate_json(capsys, *args) -> dict:
    from flashdesk.engine.cli.main import main

    assert main(["generate", "--device", "cpu", "--ignore-eos", "--json", *map(str, args)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("k", [3, 6])
def test_generate_with_the_assistant_drafts_as_transformers_round_by_round(moe_pair, k, capsys):
    """`generate --draft ASSISTANT --draft-length K --json`: the tokens of plain greedy decoding, and
    each step's drafts and accepted count those of transformers' assisted generation."""
    folder, assistant_folder, reference, their_assistant = moe_pair
    tokens, their_rounds = _their_rounds(reference, their_assistant, PROMPT, 24, k)
    ours = _generate_json(
        capsys, "--model", folder, "--draft", assistant_folder, "--draft-length", k,
        "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", 24,
    )  # fmt: skip
    assert ours["token_ids"] == tokens == _plain_greedy(reference, PROMPT, 24)
    rounds = [s for s in ours["steps"] if s["draft"]]
    assert [s["draft"] for s in rounds] == [drafts for _, drafts in their_rounds]
    # their accepted count: how much of each round's drafts the next round's input kept
    lengths = [n for n, _ in their_rounds] + [len(PROMPT) + 24]
    their_accepted = [min(lengths[i + 1] - lengths[i] - 1, len(d)) for i, (_, d) in enumerate(their_rounds)]
    assert [s["accepted"] for s in rounds][: len(their_rounds) - 1] == their_accepted[:-1]
    assert sum(s["accepted"] for s in rounds) > 0  # the random assistant guesses some: the test can tell
    assert ours["stats"]["method"] == "mtp"


# --- the engine's MTP method beyond greedy rounds: the Triton path, controls, sampling, one read a step ------


def _tokens(engine, prompt, n, control, sampling=None):
    from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest
    from flashdesk.engine.decode.sampling import SamplingParams

    request = GenerationRequest(prompt, n, sampling or SamplingParams(), ignore_eos=True)
    events = list(engine.generate(request, control))
    assert isinstance(events[-1], FinishEvent)
    return events[-1]


@pytest.fixture(scope="module")
def mtp_engine(moe_pair):
    from flashdesk.engine.decode.generation import Engine

    return Engine.load(moe_pair[0], device="cpu", kv_dtype="fp8", draft_dir=moe_pair[1])


def test_the_triton_path_with_fp8_kv_drafts_without_changing_the_output(mtp_engine):
    from flashdesk.engine.decode.speculative import SpecControl
    from flashdesk.kernels.backend import kernels

    pytest.importorskip("triton")
    with kernels("triton"):
        plain = _tokens(mtp_engine, PROMPT, 12, SpecControl(False))
        assert plain.stats["kernels"] == "triton (interpreter)"
        accepted = 0
        for k in (3, 6):
            spec = _tokens(mtp_engine, PROMPT, 12, SpecControl(True, k))
            assert spec.token_ids == plain.token_ids, f"MTP changed the output at K={k}"
            accepted += spec.stats["accepted"]
    assert accepted > 0


def test_penalties_keep_mtp_rounds_exact(mtp_engine):
    """Each verify row of a round is penalized for the drafts before it, as plain decoding would be."""
    from flashdesk.engine.decode.sampling import SamplingParams
    from flashdesk.engine.decode.speculative import SpecControl

    params = SamplingParams(repetition_penalty=1.5, presence_penalty=1.0, frequency_penalty=1.0)
    plain = _tokens(mtp_engine, PROMPT, 16, SpecControl(False), params)
    assert plain.token_ids != _tokens(mtp_engine, PROMPT, 16, SpecControl(False)).token_ids
    for k in (2, 5):
        assert _tokens(mtp_engine, PROMPT, 16, SpecControl(True, k, "mtp"), params).token_ids == plain.token_ids


def test_toggling_and_changing_k_mid_generation_stays_exact(mtp_engine):
    """Plain steps between rounds hand the next round their hidden state and window."""
    from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest
    from flashdesk.engine.decode.speculative import SpecControl

    plain = _tokens(mtp_engine, PROMPT, 40, SpecControl(False)).token_ids
    control = SpecControl(True, 2)
    schedule = {2: (False, 2), 4: (True, 6), 6: (True, 1), 8: (False, 1), 10: (True, 15)}
    tokens, drafted = [], []
    for event in mtp_engine.generate(GenerationRequest(PROMPT, 40, ignore_eos=True), control):
        if isinstance(event, FinishEvent):
            break
        tokens += event.emitted
        drafted.append(len(event.draft))
        if event.index in schedule:
            control.enabled, control.draft_length = schedule[event.index]
    assert tokens == plain
    assert 0 in drafted[1:] and max(drafted) > 6  # plain steps and long rounds both ran


def test_sampling_with_the_assistant_is_seeded_and_complete(mtp_engine):
    from flashdesk.engine.decode.sampling import SamplingParams
    from flashdesk.engine.decode.speculative import SpecControl

    sampling = SamplingParams(temperature=0.9, top_k=40, seed=7)
    first = _tokens(mtp_engine, PROMPT, 20, SpecControl(True, 4), sampling)
    again = _tokens(mtp_engine, PROMPT, 20, SpecControl(True, 4), sampling)
    assert first.token_ids == again.token_ids and len(first.token_ids) == 20
    assert first.stats["drafted"] > 0


def test_an_abandoned_round_restores_what_the_next_one_drafts_from(mtp_engine):
    """A step launched ahead and undone (a stop string, a cancel) puts the round's state back, and
    the steps after it emit what they would have. (Their drafts may differ: the undone verify
    overwrote the rejected draft's K/V that transformers' rounds attend over. In the engine an
    undone step ends the generation, and the next one starts from its prefill.)"""
    from flashdesk.engine.decode.sampling import SamplingParams
    from flashdesk.engine.decode.speculative import Decoder, SpecControl

    def run(abandon_first: bool):
        engine = mtp_engine
        decoder = Decoder(engine.model, None, 64, "fp8", SamplingParams(), set(), mtp=engine.mtp)
        decoder.prefill(PROMPT)
        decoder.step(32, SpecControl(True, 3))
        if abandon_first:
            before = decoder.mtp.state
            decoder.abandon(decoder.launch(32, SpecControl(True, 5)))
            assert decoder.mtp.state is before
        return [token for _ in range(4) for token in decoder.step(32, SpecControl(True, 4)).emitted]

    with_undo, without = run(True), run(False)
    assert with_undo[: len(without)] == without[: len(with_undo)]


def test_a_round_reads_back_only_its_tokens(mtp_engine, forbid_reads):
    from flashdesk.engine.decode.sampling import SamplingParams
    from flashdesk.engine.decode.speculative import Decoder, SpecControl

    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=1)):
        decoder = Decoder(mtp_engine.model, None, 64, "fp8", sampling, set(), mtp=mtp_engine.mtp)
        decoder.prefill(PROMPT)
        forbid_reads["armed"] = True
        for control in (SpecControl(False), SpecControl(True, 3), SpecControl(True, 6)):
            before = forbid_reads["reads"]
            assert decoder.step(32, control).emitted
            assert forbid_reads["reads"] - before == 1
        forbid_reads["armed"] = False


# --- both draft models loaded: each step drafts with the method the control names ------------------------


@pytest.fixture(scope="module")
def both(spec_pair, tmp_path_factory):
    """The trained DFlash pair's target with its drafter and an assistant beside it."""
    from flashdesk.engine.decode.generation import Engine

    engine, (target_dir, draft_dir), reference, _ = spec_pair
    assistant_dir = tmp_path_factory.mktemp("spec-assistant")
    write_echo_assistant(assistant_dir, reference, seed=4)
    return Engine.load(target_dir, device="cpu", draft_dir=draft_dir, assistant_dir=assistant_dir), engine


def test_switching_methods_mid_generation_stays_exact(both):
    from flashdesk.engine.decode.generation import FinishEvent, GenerationRequest
    from flashdesk.engine.decode.speculative import SpecControl
    from tiny_drafter import PROMPTS

    engine, dflash_only = both
    assert engine.methods.keys() == {"dflash", "mtp"} and engine.method == "dflash"
    plain = _tokens(dflash_only, PROMPTS[0], 60, SpecControl(False)).token_ids
    control = SpecControl(True, 4, method="mtp")
    schedule = {2: ("dflash", 7, True), 4: ("mtp", 3, True), 6: ("mtp", 3, False), 8: ("dflash", 15, True)}
    tokens, methods = [], []
    for event in engine.generate(GenerationRequest(PROMPTS[0], 60, ignore_eos=True), control):
        if isinstance(event, FinishEvent):
            break
        tokens += event.emitted
        methods.append(event.method)
        if event.index in schedule:
            control.method, control.draft_length, control.enabled = schedule[event.index]
    assert tokens == plain
    assert {"dflash", "mtp", None} <= set(methods[1:])
    by_method = event.stats["by_method"]
    assert by_method.keys() == {"dflash", "mtp"} and by_method["dflash"]["accepted"] > 0


def test_the_automatic_method_measures_both_and_keeps_the_output(both):
    from flashdesk.engine.decode.speculative import AUTO, SpecControl
    from tiny_drafter import PROMPTS

    engine, dflash_only = both
    plain = _tokens(dflash_only, PROMPTS[1], 40, SpecControl(False)).token_ids
    finish = _tokens(engine, PROMPTS[1], 40, SpecControl(True, method=AUTO))
    assert finish.token_ids == plain
    assert all(engine.autos[m].costs is not None for m in ("dflash", "mtp"))  # each method's step costs
    assert finish.stats["speculative_steps"] > 0


def test_a_method_whose_draft_model_is_not_loaded_is_refused_by_name(both, mtp_engine):
    with pytest.raises(ValueError, match="no dflash draft model is loaded \\(loaded: mtp\\)"):
        mtp_engine.use_method("dflash")
    assert both[1].methods.keys() == {"dflash"}


def test_the_assistant_flag_loads_beside_the_drafter_from_the_command_line(both, spec_pair, capsys, tmp_path):
    from tiny_drafter import PROMPTS

    target_dir, draft_dir = spec_pair[1]
    assistant_dir = tmp_path / "a"
    write_echo_assistant(assistant_dir, spec_pair[2], seed=4)
    prompt = ",".join(map(str, PROMPTS[0]))
    common = ["--model", target_dir, "--draft", draft_dir, "--assistant", assistant_dir, "--prompt-ids", prompt]
    mtp = _generate_json(capsys, *common, "--method", "mtp", "--draft-length", 3, "--max-new-tokens", 16)
    dflash = _generate_json(capsys, *common, "--max-new-tokens", 16)
    assert mtp["token_ids"] == dflash["token_ids"]
    assert {s.get("method") for s in mtp["steps"] if s["draft"]} == {"mtp"}
    assert {s.get("method") for s in dflash["steps"] if s["draft"]} == {"dflash"}
    from flashdesk.engine.cli.main import main

    assert main(["generate", "--model", str(target_dir), "--assistant", str(assistant_dir), "--prompt-ids", "2"]) == 2
    assert "--assistant goes beside a DFlash drafter in --draft" in capsys.readouterr().err
    assert main(["generate", *map(str, common[:4]), "--assistant", str(draft_dir), "--prompt-ids", "2"]) == 2
    assert "is not a Gemma 4 MTP assistant" in capsys.readouterr().err


def test_the_bench_runs_both_methods_side_by_side(spec_pair, both, capsys, tmp_path):
    """`flashdesk bench --assistant`: AR, DFlash and MTP at each draft length and the automatic
    method, interleaved in one run, with the same output in every mode."""
    from flashdesk.engine.cli.main import main

    target_dir, draft_dir = spec_pair[1]
    assistant_dir = tmp_path / "a"
    write_echo_assistant(assistant_dir, spec_pair[2], seed=4)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"task": "code", "prompt": "Write hello world"}\n{"task": "chat", "prompt": "Hi"}\n')
    args = ["bench", "--model", target_dir, "--draft", draft_dir, "--assistant", assistant_dir, "--prompts", prompts]
    args += ["--max-new-tokens", 10, "--draft-lengths", "2,auto", "--no-progress", "--device", "cpu", "--json"]
    assert main(list(map(str, args))) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    names = ["AR", "DFlash K=2", "DFlash auto", "MTP K=2", "MTP auto", "auto method"]
    assert [m["mode"] for m in report["modes"]] == names
    assert [m["method"] for m in report["modes"]] == [None, "dflash", "dflash", "mtp", "mtp", "auto"]
    assert report["outputs_identical"] is True and report["methods"] == ["dflash", "mtp"]
    for mode in report["modes"][1:]:
        assert set(mode["by_task"]) == {"code", "chat"} and mode["speedup_over_ar"] > 0
    assert main(list(map(str, args[:5] + ["--methods", "mtp"]))) == 2
    assert "--methods: mtp needs its draft model loaded (loaded: dflash)" in capsys.readouterr().err


@pytest.mark.parametrize("kv_dtype", ["fp8", "float32"])
def test_the_assistants_span_attention_in_place_equals_it_over_a_copy(mtp_engine, kv_dtype):
    """KVCache.attend_span on the Triton path (the decode attention over the cache where it lies,
    fp8 converted as read) gives what the torch path gives over a dequantized copy: every span a
    round can ask for, rejected keys past the held length included."""
    from flashdesk.kernels.backend import kernels

    pytest.importorskip("triton")
    model = mtp_engine.model
    cache = model.new_cache(64, kv_dtype)
    ids = (PROMPT * 4)[:45]
    model.forward(torch.tensor(ids), cache)  # 45 positions: the sliding rings (8 + 16 slots) wrapped
    cache.rollback(41)  # 4 written keys past the held length, as after a rejection
    assert cache.layers[0].capacity < 45
    window = model.cfg.sliding_window
    gen = torch.Generator().manual_seed(3)
    for kind, spans in (
        (FULL, [(0, 42, None), (0, 45, None), (0, 3, None)]),
        (SLIDING, [(34, 45, window + 1), (36, 44, window + 1), (0, 5, window + 1), (38, 45, window + 1)]),
    ):
        layer = max(i for i, spec in enumerate(model.cfg.layers) if spec.kind == kind)
        spec = model.cfg.layers[layer]
        q = torch.randn(1, model.cfg.num_heads, spec.head_dim, generator=gen)
        for lo, hi, keep in spans:
            with kernels("torch"):
                copy = cache.attend_span(layer, q, lo, hi, keep)
            with kernels("triton"):
                in_place = cache.attend_span(layer, q, lo, hi, keep)
            torch.testing.assert_close(in_place, copy, rtol=2e-3, atol=2e-3, msg=f"{kind} {lo}..{hi} keep {keep}")


def test_every_emitted_row_reaches_the_drafters_context_whichever_method_drafted(both):
    """Rows verified by MTP rounds and plain steps wait for the DFlash drafter as its own do: after
    every step its context plus the rows waiting is exactly what the target's cache holds."""
    from flashdesk.engine.decode.sampling import SamplingParams
    from flashdesk.engine.decode.speculative import Decoder, SpecControl
    from tiny_drafter import PROMPTS

    engine = both[0]
    decoder = Decoder(engine.model, engine.drafter, 256, "float32", SamplingParams(), set(), mtp=engine.mtp)
    decoder.prefill(PROMPTS[0])
    schedule = [("mtp", 3), (None, 0), ("dflash", 7), ("mtp", 15), ("dflash", 15), ("mtp", 1), ("dflash", 2)]
    for method, k in schedule * 3:
        decoder.step(64, SpecControl(method is not None, k or None, method))
        waiting = sum(rows.shape[0] for rows in decoder.pending)
        assert decoder.ctx.length + waiting == decoder.cache.length, (method, k)
