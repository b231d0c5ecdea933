"""Loading z-lab's drafter: both RoPE spellings, and clear refusals for drafters that cannot work."""

import json
import shutil

import pytest
import torch

from flashdesk.engine.loading.build import load_drafter
from flashdesk.engine.model.config import load_draft_config
from flashdesk.engine.errors import CheckpointError, ConfigError
from tiny_drafter import write_drafter


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("drafter")
    write_drafter(folder, seed=4)
    return folder


@pytest.fixture
def copy(drafter_dir, tmp_path):
    folder = tmp_path / "drafter"
    shutil.copytree(drafter_dir, folder)
    return folder


def edit(folder, change):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def test_reads_the_real_config_fields(drafter_dir):
    cfg = load_draft_config(drafter_dir)
    assert cfg.block_size == 16 and cfg.mask_token_id == 4 and cfg.target_layer_ids == (1, 3, 4)
    assert cfg.causal == (True, True, False) and cfg.sliding_window == 6
    assert cfg.input_embedding_scale == 1.0 and cfg.final_logit_softcapping == 30.0


def test_rope_nested_under_rope_parameters_gives_the_same_drafter(tmp_path, spec_pair):
    target = spec_pair[0].model
    write_drafter(tmp_path / "top", seed=4)
    write_drafter(tmp_path / "nested", seed=4, nested_rope=True)
    assert "rope_theta" not in json.loads((tmp_path / "nested" / "config.json").read_text())
    a, b = load_drafter(tmp_path / "top", target), load_drafter(tmp_path / "nested", target)
    assert a.cfg == b.cfg and torch.equal(a.rope_freqs, b.rope_freqs)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.update(conv_kernel_size=4, conv_group_size=16), "DFlash2 drafters"),
        (lambda c: c["dflash_config"].update(selector_top_k=8), "DFlash2 drafters"),
        (lambda c: c.update(architectures=["Qwen3ForCausalLM"]), "not a DFlash drafter"),
        (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id is missing"),
        (lambda c: c.update(hidden_act="gelu"), "drafter activation 'gelu'"),
        (lambda c: c.pop("rope_theta"), "no rope_theta"),
    ],
)
def test_unsupported_drafters_are_refused_by_name(copy, change, message):
    edit(copy, change)
    with pytest.raises(ConfigError, match=message):
        load_draft_config(copy)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.update(hidden_size=32, head_dim=8), "hidden size 32 != target's 64"),
        (lambda c: c.update(vocab_size=1024), "vocabulary 1024 != target's 512"),
        (lambda c: c["dflash_config"].update(target_layer_ids=[1, 3, 9]), "name layer 9"),
        (lambda c: c.update(num_target_layers=30), "num_target_layers 30 != target's 6"),
    ],
)
def test_a_drafter_for_another_target_is_refused(copy, spec_pair, change, message):
    edit(copy, change)
    with pytest.raises(ConfigError, match=f"does not match the target model: .*{message}"):
        load_drafter(copy, spec_pair[0].model)


def test_missing_drafter_weight_is_named(copy, spec_pair):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(copy / "model.safetensors"))
    tensors.pop("layers.2.self_attn.k_norm.weight")
    save_file(tensors, str(copy / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor layers\.2\.self_attn\.k_norm\.weight"):
        load_drafter(copy, spec_pair[0].model)
