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
    logits, next_hidden = ours.step(embedding, hidden, kv, positions - 1)
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


def test_an_assistant_as_the_drafter_is_refused_with_what_works_instead(assistant, tmp_path):
    from flashdesk.engine.decode.generation import Engine

    target = tmp_path / "t"
    write_checkpoint(target, "causal", seed=3, tokenizer=False, enable_moe_block=False)
    with pytest.raises(ConfigError, match="MTP assistant: FlashDesk reads and checks it .* use the DFlash drafter"):
        Engine.load(target, device="cpu", draft_dir=assistant[0])


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
    """A tiny MoE target (as the real one) and an assistant for it, ours and transformers'."""
    folder, assistant_folder = tmp_path_factory.mktemp("moe-target"), tmp_path_factory.mktemp("moe-assistant")
    reference = write_checkpoint(folder, "causal", seed=5, tokenizer=False)
    their_assistant = write_echo_assistant(assistant_folder, reference, seed=11)
    target = load_target(folder)
    return target, load_assistant(assistant_folder, target), reference, their_assistant


@pytest.mark.parametrize("k", [3, 6])
def test_rounds_match_transformers_assisted_decoding_and_plain_greedy(moe_pair, k):
    from flashdesk.engine.decode.mtp import mtp_greedy

    target, assistant, reference, their_assistant = moe_pair
    prompt = [2, 17, 91, 33, 250, 7, 7, 64, 301, 12, 5, 88]  # longer than the sliding window of 8
    tokens, their_rounds = _their_rounds(reference, their_assistant, prompt, 24, k)
    ours = mtp_greedy(target, assistant, prompt, 24, k)
    with torch.no_grad():
        plain = reference.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :].tolist()
    assert ours.tokens == tokens == plain
    assert [r.drafts for r in ours.rounds] == [drafts for _, drafts in their_rounds]
    assert sum(r.accepted for r in ours.rounds) > 0  # the random assistant guesses some: the test can tell
