"""Real checkpoints as they come: compressed-tensors exports that say the same thing in other words.

The target's export has never been read on these machines, so the loader is tried on the forms a
compressed-tensors export may take (packed and dequantized by compressed-tensors itself, the
reference run by transformers): config groups targeting `re:` patterns, exact names or class names,
spread over several groups with different group sizes, channel scales and zero points; `ignore`
entries as names or patterns; the dense MLPs left in bf16 beside int4 experts; experts fused or per
expert; with and without the optional `weight_shape` tensors. And what no export should get past:
a tensor the engine does not know, or one weight quantized two ways.
"""

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashdesk.engine.loading.build import load_target
from flashdesk.engine.decode.generation import Engine, FinishEvent, GenerationRequest
from flashdesk.engine.errors import CheckpointError
from flashdesk.kernels.backend import kernels
from flashdesk.kernels.int4 import Int4Weight
from tiny_drafter import PROMPTS
from tiny_int4 import Recipe, weights_json, write_int4_checkpoint

pytest.importorskip("compressed_tensors")

LAYERS = 6
PREFIX = {"conditional": "model.language_model.", "causal": "model."}
EXPERTS = ("experts.gate_up_proj", "experts.down_proj")
TOKENS = 24


def _kind(name: str) -> str:
    if name.endswith(EXPERTS):
        return "experts"
    return "attention" if ".self_attn." in name else "mlp"


def _layer(name: str) -> int:
    return int(re.search(r"layers\.(\d+)\.", name).group(1))


def regex_groups(layout: str) -> Recipe:
    """As the target's export is reported: three groups by `re:` pattern (attention asymmetric group
    8, experts channel-wise, the last layer's dense MLP symmetric group 8); every other dense MLP
    in bf16, its modules listed by exact name in `ignore`."""
    bf16_mlps = [
        f"{PREFIX[layout]}layers.{i}.mlp.{p}" for i in range(LAYERS - 1) for p in ("gate_proj", "up_proj", "down_proj")
    ]

    def scheme(name):
        kind = _kind(name)
        if kind == "mlp":
            return (8, True) if _layer(name) == LAYERS - 1 else None
        return (8, False) if kind == "attention" else (None, True)

    return Recipe(
        "regex-groups",
        scheme,
        {
            "attention": {"targets": [r"re:.*self_attn\.(q|k|v|o)_proj$"], "weights": weights_json(False, 8)},
            "experts": {"targets": [r"re:.*experts.*"], "weights": weights_json(True, None)},
            "mlp": {"targets": [r"re:.*mlp\.(gate|up|down)_proj$"], "weights": weights_json(True, 8)},
        },
        ["lm_head", r"re:.*vision.*", *bf16_mlps],
    )


def class_names(layout: str) -> Recipe:
    """Targets by class: "Linear" (symmetric) and the experts' own class (asymmetric), which wins
    for the experts; layer 2's MLP in bf16 by an exact-name pattern; no `weight_shape` tensors."""

    def scheme(name):
        if _kind(name) == "mlp" and _layer(name) == 2:
            return None
        return (8, False) if _kind(name) == "experts" else (8, True)

    return Recipe(
        "class-names",
        scheme,
        {
            "group_0": {"targets": ["Linear"], "weights": weights_json(True, 8)},
            "group_1": {"targets": ["Gemma4TextExperts"], "weights": weights_json(False, 8)},
        },
        ["lm_head", r"re:.*layers\.2\.mlp\..*"],
        weight_shape=False,
    )


def channel_all_bf16_mlps(layout: str) -> Recipe:
    """One channel-wise asymmetric group for every Linear; every dense MLP in bf16 (one pattern)."""
    return Recipe(
        "channel",
        lambda name: None if _kind(name) == "mlp" else (None, False),
        {"group_0": {"targets": ["Linear"], "weights": weights_json(False, None)}},
        ["lm_head", r"re:.*\.mlp\..*"],
    )


RECIPES = {"regex-groups": regex_groups, "class-names": class_names, "channel": channel_all_bf16_mlps}
VARIANTS = [
    ("conditional", "per_expert", "regex-groups"),
    ("causal", "fused", "regex-groups"),
    ("conditional", "fused", "class-names"),
    ("causal", "per_expert", "class-names"),
    ("conditional", "fused", "channel"),
]


@pytest.fixture(scope="module", params=VARIANTS, ids=["-".join(v) for v in VARIANTS])
def variant(request, tmp_path_factory):
    layout, experts, recipe_name = request.param
    folder = tmp_path_factory.mktemp(recipe_name)
    recipe = RECIPES[recipe_name](layout)
    reference = write_int4_checkpoint(folder, layout, experts, seed=5, recipe=recipe)
    return folder, reference, recipe, layout


def _finish(engine, prompt, n):
    events = engine.generate(GenerationRequest(prompt, n, ignore_eos=True))
    return [e for e in events if isinstance(e, FinishEvent)][0]


def _greedy(engine, prompt, n):
    return _finish(engine, prompt, n).token_ids


def _reference_greedy(reference, prompt, n):
    with torch.no_grad():
        seq = reference.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return seq[0, len(prompt) :].tolist()


def _expect_format(weight, scheme, what):
    if scheme is None:
        assert isinstance(weight, torch.Tensor), f"{what} should stay bf16"
        return
    group, symmetric = scheme
    assert isinstance(weight, Int4Weight), f"{what} should be int4"
    assert (weight.zero is None) == symmetric, what
    assert weight.group_size == (group or weight.shape[-1]), what


def test_each_variant_loads_as_its_config_says_and_matches_transformers(variant):
    folder, reference, recipe, layout = variant
    model = load_target(folder)
    p = PREFIX[layout]
    for i, layer in enumerate(model.layers):
        _expect_format(layer.qkv, recipe.scheme(f"{p}layers.{i}.self_attn.q_proj.weight"), f"layer {i} qkv")
        _expect_format(layer.gate_up, recipe.scheme(f"{p}layers.{i}.mlp.gate_proj.weight"), f"layer {i} MLP")
        _expect_format(layer.down, recipe.scheme(f"{p}layers.{i}.mlp.down_proj.weight"), f"layer {i} MLP down")
        _expect_format(
            layer.experts_gate_up, recipe.scheme(f"{p}layers.{i}.experts.gate_up_proj"), f"layer {i} experts"
        )
    engine = Engine.load(folder, device="cpu")
    for prompt in PROMPTS[:2]:
        assert _greedy(engine, prompt, TOKENS) == _reference_greedy(reference, prompt, TOKENS)


def test_the_mixed_variant_runs_the_triton_path_as_the_torch_path(tmp_path):
    """Channel-wise and group-8 int4, asymmetric and symmetric, bf16 dense MLPs beside int4
    experts: every kernel's case of the real export, through the interpreter."""
    write_int4_checkpoint(tmp_path, "conditional", "per_expert", seed=5, recipe=regex_groups("conditional"))
    engine = Engine.load(tmp_path, device="cpu", kv_dtype="fp8")
    prompt = PROMPTS[0]
    with kernels("torch"):
        expected = _finish(engine, prompt, 8)
    with kernels("triton"):
        got = _finish(engine, prompt, 8)
    assert got.stats["kernels"] == "triton (interpreter)" and not got.stats.get("fallbacks")
    assert got.token_ids == expected.token_ids


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("variants-pristine")
    write_int4_checkpoint(folder, "conditional", "per_expert", seed=5, recipe=regex_groups("conditional"))
    return folder


@pytest.fixture
def copy(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "m")
    return tmp_path / "m"


def _add_tensor(folder, name, tensor):
    tensors = load_file(str(folder / "model.safetensors"))
    tensors[name] = tensor
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "name, hint",
    [
        ("model.language_model.layers.1.self_attn.q_proj.weight_g_idx", "activation order"),
        ("model.language_model.layers.1.mlp.mystery.weight", "config.json"),
    ],
)
def test_an_unknown_tensor_is_refused_by_name_with_what_to_do(copy, name, hint):
    _add_tensor(copy, name, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(CheckpointError) as caught:
        load_target(copy)
    message = str(caught.value)
    assert name in message and hint in message and "\n" not in message


def test_an_unknown_tensor_costs_the_cli_one_line_and_no_traceback(copy):
    name = "model.language_model.layers.1.mlp.mystery.weight"
    _add_tensor(copy, name, torch.zeros(4))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "flashdesk",
            "generate",
            "--model",
            str(copy),
            "--device",
            "cpu",
            "--prompt-ids",
            "2,10",
            "--max-new-tokens",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    lines = [line for line in run.stderr.splitlines() if name in line]
    assert len(lines) == 1, run.stderr


def test_one_weight_quantized_two_ways_is_refused_naming_both(copy):
    """Per-expert modules of one stacked weight must share a scheme (one Int4Weight)."""
    config = json.loads((copy / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    groups["expert_3"] = {
        "targets": ["model.language_model.layers.1.experts.3.gate_proj"],
        "weights": weights_json(True, 8),
    }
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError,
        match=r"experts\.0\.gate_proj and .*experts\.3\.gate_proj .*quantized "
        r"differently",
    ):
        load_target(copy)
