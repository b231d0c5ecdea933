"""4-bit targets: compressed-tensors checkpoints against transformers on the same dequantized weights,
with and without DFlash, fp8 KV included; on-load quantization; refusals of other schemes."""

import json
import shutil

import pytest
import torch

from flashdesk.engine.loading.build import load_target
from flashdesk.engine.errors import CheckpointError, ConfigError
from flashdesk.engine.decode.generation import Engine, FinishEvent, GenerationRequest
from flashdesk.engine.decode.speculative import SpecControl
from flashdesk.kernels.int4 import Int4Weight, quantize_int4
from tiny_checkpoints import write_checkpoint
from tiny_drafter import PROMPTS, write_drafter
from tiny_int4 import ct_quantize, write_int4_checkpoint

pytest.importorskip("compressed_tensors")

VARIANTS = [
    ("conditional", "fused", True),
    ("causal", "per_expert", False),
    ("conditional", "per_expert", True),
    ("causal", "fused", False),
]


@pytest.fixture(scope="module", params=VARIANTS, ids=["-".join(map(str, v)) for v in VARIANTS])
def int4_pair(request, tmp_path_factory):
    layout, experts, symmetric = request.param
    folder = tmp_path_factory.mktemp("int4")
    reference = write_int4_checkpoint(folder, layout, experts, symmetric, seed=3)
    return folder, reference


def reference_greedy(reference, prompt, n):
    """transformers' own greedy generate, never stopping early."""
    with torch.no_grad():
        seq = reference.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return seq[0, len(prompt) :].tolist()


def generate(engine, prompt, n, control=None):
    events = engine.generate(GenerationRequest(prompt, n, ignore_eos=True), control)
    return [e for e in events if isinstance(e, FinishEvent)][0].token_ids


def test_weights_stay_packed(int4_pair):
    folder, _ = int4_pair
    model = load_target(folder)
    layer0, layer1 = model.layers[0], model.layers[1]
    assert isinstance(layer1.qkv, Int4Weight) and isinstance(layer1.experts_gate_up, Int4Weight)
    assert isinstance(layer0.gate_up, torch.Tensor)  # the MLP listed in `ignore`
    assert isinstance(model.embed, torch.Tensor) and isinstance(layer1.router, torch.Tensor)
    assert layer1.experts_gate_up.packed.dtype == torch.int32
    assert layer1.experts_gate_up.shape == (8, 48, 64)


def test_greedy_64_tokens_match_transformers_on_the_dequantized_weights(int4_pair):
    folder, reference = int4_pair
    engine = Engine.load(folder, device="cpu")
    prompt = PROMPTS[0]
    assert generate(engine, prompt, 64) == reference_greedy(reference, prompt, 64)


@pytest.fixture(scope="module")
def int4_with_drafter(tmp_path_factory):
    target = tmp_path_factory.mktemp("int4-target")
    drafter = tmp_path_factory.mktemp("int4-drafter")
    reference = write_int4_checkpoint(target, "conditional", "fused", True, seed=3)
    write_drafter(drafter, seed=2, target=reference)
    return target, drafter, reference


def test_dflash_on_an_int4_target_matches_transformers(int4_with_drafter):
    target, drafter, reference = int4_with_drafter
    engine = Engine.load(target, device="cpu", draft_dir=drafter)
    for prompt in PROMPTS:
        expected = reference_greedy(reference, prompt, 64)
        assert generate(engine, prompt, 64, SpecControl(True, 7)) == expected


def test_int4_fp8_kv_and_dflash_together_are_exact(int4_with_drafter):
    target, drafter, _ = int4_with_drafter
    engine = Engine.load(target, device="cpu", kv_dtype="fp8", draft_dir=drafter)
    accepted = 0
    for prompt in PROMPTS:
        plain = generate(engine, prompt, 64, SpecControl(False))
        for k in (3, 15):
            events = list(engine.generate(GenerationRequest(prompt, 64, ignore_eos=True), SpecControl(True, k)))
            assert events[-1].token_ids == plain
            accepted += events[-1].stats["accepted"]
    assert accepted > 0


def test_our_packing_is_compressed_tensors_packing():
    """On-load quantization writes exactly what compressed-tensors writes for symmetric group-32."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    w = torch.randn(48, 96, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    ours = quantize_int4(w, 32)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
    theirs = PackedQuantizationCompressor.compress(
        {"weight": w, "weight_scale": ours.scale}, QuantizationScheme(targets=["Linear"], weights=args)
    )
    assert torch.equal(ours.packed, theirs["weight_packed"])
    packed, restored = ct_quantize(w.float(), symmetric=True)  # and dequantization agrees too
    assert torch.allclose(
        Int4Weight(packed["weight_packed"], packed["weight_scale"], None, 8).dequantize(torch.float32), restored
    )


def test_our_scales_are_compressed_tensors_scales():
    """The group scales on-load quantization computes are the ones compressed-tensors computes from
    the same groups' minima and maxima: a group led by a negative value, and all-zero groups, which
    take the dtype's eps."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        w = torch.randn(48, 96, generator=torch.Generator().manual_seed(1)).to(dtype)
        w[0, :32], w[1, 32:64], w[2, 70] = 0.0, -0.0, -40.0
        groups = w.view(48, 3, 32)
        theirs, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
        assert torch.equal(quantize_int4(w, 32).scale, theirs.to(dtype)), dtype


def test_on_load_quantization_packs_every_linear_and_expert_weight(tmp_path):
    """--quantize int4 on a bf16 checkpoint: linears and experts packed while loading (group 32),
    the embedding and the routers left alone; each weight within int4's error of the original."""
    write_checkpoint(tmp_path, "conditional", seed=9, tokenizer=False, moe_intermediate_size=32, dtype=torch.bfloat16)
    dense = load_target(tmp_path, dtype=torch.bfloat16)
    packed = load_target(tmp_path, dtype=torch.bfloat16, quantize="int4")
    for d, q in zip(dense.layers, packed.layers):
        assert isinstance(q.qkv, Int4Weight) and isinstance(q.gate_up, Int4Weight)
        assert isinstance(q.experts_gate_up, Int4Weight) and isinstance(q.experts_down, Int4Weight)
        assert isinstance(q.router, torch.Tensor) and torch.equal(q.router, d.router)
        for original, quantized in ((d.qkv, q.qkv), (d.experts_down, q.experts_down)):
            error = (quantized.dequantize(torch.float32) - original.float()).norm() / original.float().norm()
            assert error < 0.12  # 4-bit round to nearest: ~8% relative error on Gaussian weights
    assert torch.equal(packed.embed, dense.embed)


def test_on_load_quantization_quality_against_bf16(tmp_path, monkeypatch):
    """Next-token distributions of the int4 model against the unquantized one (KL, top-1 agreement),
    and finer groups must do better. Measured on the dense-MLP variant: random routers have near-zero
    margins, so any perturbation flips experts and swamps the measurement (as for the fp8 KV test).
    Random tiny models are far more sensitive than trained ones (attention at scale 1.0 over 16-dim
    heads is nearly one-hot), so the absolute bounds are loose; they catch a broken packing."""
    import flashdesk.engine.loading.build as build
    from flashdesk.engine.loading.quant import quantize_on_load

    write_checkpoint(tmp_path, "conditional", seed=9, tokenizer=False, enable_moe_block=False)
    dense = load_target(tmp_path)
    ids = torch.randint(5, 512, (48,), generator=torch.Generator().manual_seed(0))
    p = dense.forward(ids, dense.new_cache(48, "float32")).logits.log_softmax(-1)

    def measure(group):
        monkeypatch.setattr(build, "quantize_on_load", lambda: quantize_on_load(group))
        packed = load_target(tmp_path, quantize="int4")
        q = packed.forward(ids, packed.new_cache(48, "float32")).logits.log_softmax(-1)
        kl = torch.nn.functional.kl_div(q, p, log_target=True, reduction="batchmean").item()
        return kl, (p.argmax(-1) == q.argmax(-1)).float().mean().item()

    (kl32, top32), (kl8, top8) = measure(32), measure(8)
    print(
        f"\non-load int4 vs unquantized, tiny dense model: group 32 KL {kl32:.3f} top-1 {top32:.2f}; "
        f"group 8 KL {kl8:.3f} top-1 {top8:.2f}"
    )
    assert 0 < kl8 < kl32 < 0.6
    assert top32 >= 0.4 and top8 >= top32


def edit_quant(folder, **fields):
    config = json.loads((folder / "config.json").read_text())
    for path, value in fields.items():
        node = config["quantization_config"]
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def pristine_int4(tmp_path_factory):
    folder = tmp_path_factory.mktemp("int4-pristine")
    write_int4_checkpoint(folder, "causal", "fused", True, seed=1)
    return folder


@pytest.fixture
def int4_copy(pristine_int4, tmp_path):
    shutil.copytree(pristine_int4, tmp_path / "m")
    return tmp_path / "m"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"quant_method": "awq"}, "quant_method 'awq'"),
        ({"format": "nvfp4-pack-quantized"}, "format 'nvfp4-pack-quantized'"),
        ({"format": "float-quantized"}, "format 'float-quantized'"),
        ({"config_groups__group_0__weights__num_bits": 8}, "8-bit weights"),
        ({"config_groups__group_0__weights__type": "float"}, "4-bit float weights"),
        ({"config_groups__group_0__input_activations": {"num_bits": 8, "type": "int"}}, "8-bit int activations"),
        ({"config_groups__group_0__input_activations": {"num_bits": 8, "type": "float"}}, "8-bit float activations"),
    ],
)
def test_other_schemes_are_refused_by_name(int4_copy, fields, message):
    edit_quant(int4_copy, **fields)
    with pytest.raises(ConfigError, match=message):
        load_target(int4_copy)


def test_a_packed_module_listed_in_ignore_is_refused(int4_copy):
    edit_quant(int4_copy, ignore=[r"re:.*self_attn.*"])
    with pytest.raises(CheckpointError, match=r"self_attn.q_proj is listed in quantization_config.ignore"):
        load_target(int4_copy)


def test_packed_weights_without_a_quantization_config_are_refused(int4_copy):
    config = json.loads((int4_copy / "config.json").read_text())
    del config["quantization_config"]
    (int4_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="stored packed .* no quantization_config"):
        load_target(int4_copy)


def test_a_missing_scale_is_named(int4_copy):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(int4_copy / "model.safetensors"))
    tensors.pop("model.layers.2.experts.down_proj_scale")
    save_file(tensors, str(int4_copy / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor layers\.2\.experts\.down_proj_scale"):
        load_target(int4_copy)


def test_quantizing_an_already_quantized_checkpoint_is_refused(int4_copy):
    with pytest.raises(ValueError, match="already quantized"):
        load_target(int4_copy, quantize="int4")
