"""Every bad checkpoint or config is refused with a message that names the problem and where it is."""

import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashdesk.engine.loading.build import load_target
from flashdesk.engine.model.config import load_config, parse_config
from flashdesk.engine.errors import CheckpointError, ConfigError
from tiny_checkpoints import write_checkpoint


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pristine")
    write_checkpoint(folder, "causal", seed=1, tokenizer=False)
    return folder


@pytest.fixture
def ckpt(pristine, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(pristine, folder)
    return folder


def rewrite(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def edit_config(folder, **fields):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))


def test_pristine_loads(ckpt):
    assert load_target(ckpt).cfg.num_layers == 6


@pytest.mark.parametrize(
    "fields, feature",
    [
        ({"hidden_size_per_layer_input": 256}, "per-layer inputs"),
        ({"num_kv_shared_layers": 2}, "KV sharing"),
        ({"use_bidirectional_attention": "all"}, "bidirectional text attention"),
        ({"hidden_activation": "silu"}, "activation 'silu'"),
        ({"architectures": ["LlamaForCausalLM"]}, "LlamaForCausalLM"),
    ],
)
def test_unsupported_features_are_refused_by_name(ckpt, fields, feature):
    edit_config(ckpt, **fields)
    with pytest.raises(ConfigError, match=feature):
        load_config(ckpt)


def test_unknown_rope_type_is_refused(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["rope_parameters"]["full_attention"]["rope_type"] = "yarn"
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="rope_type 'yarn'"):
        load_config(ckpt)


def test_missing_and_corrupt_config(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON: .*config.json"):
        load_config(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(ConfigError, match="model config not found"):
        load_config(ckpt)


def test_missing_required_field():
    with pytest.raises(ConfigError, match="'hidden_size' is missing"):
        parse_config({"architectures": ["Gemma4ForCausalLM"], "num_hidden_layers": 2})


def test_missing_tensor_is_named(ckpt):
    rewrite(ckpt, lambda t: t.pop("model.layers.3.router.per_expert_scale"))
    with pytest.raises(CheckpointError, match=r"missing tensor layers\.3\.router\.per_expert_scale"):
        load_target(ckpt)


def test_extra_tensor_is_named(ckpt):
    rewrite(ckpt, lambda t: t.update({"model.layers.0.self_attn.bias_that_should_not_be": torch.zeros(3)}))
    with pytest.raises(
        CheckpointError, match="unexpected tensor model.layers.0.self_attn.bias_that_should_not_be in model.safetensors"
    ):
        load_target(ckpt)


def test_misshapen_tensor_is_named(ckpt):
    rewrite(ckpt, lambda t: t.update({"model.layers.2.self_attn.k_proj.weight": torch.zeros(16, 64)}))
    with pytest.raises(
        CheckpointError,
        match=r"model.layers.2.self_attn.k_proj.weight in model.safetensors "
        r"has shape \[16, 64\], expected \[32, 64\]",
    ):
        load_target(ckpt)


def test_wrong_dtype_is_named(ckpt):
    rewrite(ckpt, lambda t: t.update({"model.norm.weight": torch.zeros(64, dtype=torch.int32)}))
    with pytest.raises(CheckpointError, match="model.norm.weight in model.safetensors has dtype I32"):
        load_target(ckpt)


def test_truncated_file_is_detected(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors: truncated: tensor .* ends at byte"):
        load_target(ckpt)


def test_corrupt_header_is_detected(ckpt):
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    (header_len,) = struct.unpack("<Q", data[:8])
    data[8 : 8 + 10] = b"\xff" * 10
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        load_target(ckpt)


def test_no_weights_at_all(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors.index.json and no model.safetensors"):
        load_target(ckpt)


def test_missing_shard_is_named(tmp_path):
    write_checkpoint(tmp_path, "conditional", seed=2, shard=True, tokenizer=False)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"missing: {shard.name}"):
        load_target(tmp_path)


def test_vision_tower_is_never_loaded(tmp_path):
    """The conditional layout holds vision weights; loading skips them instead of calling them extra."""
    write_checkpoint(tmp_path, "conditional", seed=2, tokenizer=False)
    names = load_file(str(tmp_path / "model.safetensors")).keys()
    assert any(name.startswith("model.vision_tower.") for name in names)
    model = load_target(tmp_path)
    assert model.cfg.architecture == "Gemma4ForConditionalGeneration"
