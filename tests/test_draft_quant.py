"""The int4 drafter (`--draft-quantize int4`): int4 linears and an int4 copy of the target's head
for drafting only. The target still verifies every token, so greedy output must not change; drafts
must still get accepted; a draft step must read about a quarter of the bytes."""

import pytest
import torch

from flashdesk.engine.loading.build import load_drafter, load_target
from flashdesk.engine.decode.generation import Engine, GenerationRequest, StepEvent
from flashdesk.engine.decode.speculative import SpecControl
from flashdesk.engine.model.drafter import Drafter
from flashdesk.engine.cli.main import main
from flashdesk.kernels.int4 import Int4Weight
from tiny_drafter import PROMPTS

pytest.importorskip("dflash.model", reason="z-lab's dflash trains the tiny drafter")


@pytest.fixture(scope="module")
def int4_engine(spec_pair):
    """The spec_pair target (fp32 on the CPU) with the same drafter loaded as int4."""
    engine, (_, draft_dir), _, _ = spec_pair
    drafter = load_drafter(draft_dir, engine.model, quantize="int4")
    return Engine(engine.model, engine.tokenizer, engine.eos, engine.kv_dtype, engine.context_limit, drafter)


def run(engine, prompt, max_new, control):
    events = list(engine.generate(GenerationRequest(prompt, max_new), control))
    steps = [e for e in events if isinstance(e, StepEvent) and e.index > 0]
    return events[-1].token_ids, sum(len(e.draft) for e in steps), sum(e.accepted for e in steps)


def test_every_linear_and_the_head_are_int4(int4_engine, spec_pair):
    drafter = int4_engine.drafter
    assert isinstance(drafter.fc, Int4Weight) and isinstance(drafter.head, Int4Weight)
    for layer in drafter.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            assert isinstance(layer[name], Int4Weight), name
    assert drafter.head.shape == tuple(spec_pair[0].model.embed.shape)
    assert not isinstance(spec_pair[0].model.embed, Int4Weight)  # the target's own head stays dense
    assert spec_pair[0].drafter.head is spec_pair[0].model.embed  # bf16 drafter: the tied head itself


@pytest.mark.parametrize("k", [1, 7, 15])
@pytest.mark.parametrize("prompt", PROMPTS, ids=["chat", "short", "long"])
def test_greedy_output_with_int4_speculation_equals_without(spec_pair, int4_engine, prompt, k):
    plain, _, _ = run(spec_pair[0], prompt, 40, SpecControl(enabled=False))
    spec, drafted, _ = run(int4_engine, prompt, 40, SpecControl(True, k))
    assert spec == plain
    assert drafted > 0


def test_int4_drafts_are_still_accepted(spec_pair, int4_engine):
    """On the trained tiny pair the int4 drafter's acceptance stays close to the bf16 one's."""
    rates = {}
    for name, engine in (("dense", spec_pair[0]), ("int4", int4_engine)):
        drafted = accepted = 0
        for prompt in PROMPTS:
            for k in (7, 15):
                _, d, a = run(engine, prompt, 48, SpecControl(True, k))
                drafted, accepted = drafted + d, accepted + a
        rates[name] = accepted / drafted
    print(f"acceptance rate: dense {rates['dense']:.3f}, int4 {rates['int4']:.3f}")
    assert rates["dense"] > 0
    assert rates["int4"] > 0.5 * rates["dense"]


def test_a_draft_step_reads_under_a_third_of_the_bf16_bytes(spec_pair):
    target_dir, draft_dir = spec_pair[1]
    target = load_target(target_dir, "cpu", torch.bfloat16)
    dense = load_drafter(draft_dir, target)
    int4 = load_drafter(draft_dir, target, quantize="int4")
    embed_bytes = target.embed.numel() * 2
    assert dense.nbytes() > embed_bytes  # the whole head is counted
    print(
        f"draft step weight bytes: bf16 {dense.nbytes()}, int4 {int4.nbytes()} "
        f"({dense.nbytes() / int4.nbytes():.2f}x less)"
    )
    assert dense.nbytes() >= 3 * int4.nbytes()


def test_unknown_quantization_is_refused_by_name(spec_pair, capsys):
    engine, (target_dir, draft_dir), _, _ = spec_pair
    with pytest.raises(ValueError, match="unknown drafter quantization 'int8': the choice is int4"):
        load_drafter(draft_dir, engine.model, quantize="int8")
    with pytest.raises(ValueError, match="unknown drafter quantization 'fp8'"):
        Drafter(engine.drafter.cfg, {}, engine.model, quantize="fp8")
    with pytest.raises(SystemExit):
        main(
            [
                "generate",
                "--model",
                str(target_dir),
                "--draft",
                str(draft_dir),
                "--prompt-ids",
                "2,17",
                "--draft-quantize",
                "int8",
            ]
        )
    assert "--draft-quantize: invalid choice: 'int8'" in capsys.readouterr().err
    assert main(["generate", "--model", str(target_dir), "--prompt-ids", "2,17", "--draft-quantize", "int4"]) == 2
    assert "--draft-quantize needs --draft" in capsys.readouterr().err


def test_cli_generate_with_the_int4_drafter_gives_the_plain_output(spec_pair, capsys):
    import json

    target_dir, draft_dir = spec_pair[1]
    common = [
        "generate",
        "--model",
        str(target_dir),
        "--prompt-ids",
        ",".join(map(str, PROMPTS[0])),
        "--max-new-tokens",
        "24",
        "--device",
        "cpu",
        "--json",
    ]
    outputs = []
    for extra in ([], ["--draft", str(draft_dir), "--draft-quantize", "int4"]):
        assert main(common + extra) == 0
        outputs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert outputs[1]["token_ids"] == outputs[0]["token_ids"]
    assert sum(step["accepted"] for step in outputs[1]["steps"]) > 0


@pytest.mark.parametrize("quantized", [False, True], ids=["dense", "int4"])
def test_anchor_as_a_device_tensor_gives_the_same_logits(spec_pair, int4_engine, quantized):
    engine = int4_engine if quantized else spec_pair[0]
    drafter, model = engine.drafter, engine.model
    ctx = drafter.new_context(64)
    taps = torch.randn(20, drafter.fc.shape[1], generator=torch.Generator().manual_seed(0)).to(drafter.dtype)
    drafter.add_context(ctx, taps)
    anchor = 300
    by_int = drafter.draft_logits(ctx, anchor, 7)
    by_tensor = drafter.draft_logits(ctx, torch.tensor([anchor], device=drafter.device), 7)
    by_scalar_tensor = drafter.draft_logits(ctx, torch.tensor(anchor, device=drafter.device), 7)
    assert torch.equal(by_int, by_tensor) and torch.equal(by_int, by_scalar_tensor)
    assert by_int.shape == (7, model.cfg.vocab_size)
    assert not torch.equal(by_int, drafter.draft_logits(ctx, anchor + 1, 7))  # the anchor is used


def test_the_drafter_is_int4_by_default_on_a_gpu_and_bf16_on_the_cpu():
    """`auto` (every entry point's default): a GPU drafts with int4 weights and head (a draft step
    reads about a fifth of a plain step's bytes instead of two thirds), the CPU with the checkpoint's
    weights; `none` and `int4` are taken as said, on any device."""
    from flashdesk.engine.model.drafter import resolve_draft_quantize

    assert resolve_draft_quantize("auto", torch.device("cuda")) == "int4"
    assert resolve_draft_quantize("auto", torch.device("cpu")) is None
    for device in ("cpu", "cuda"):
        assert resolve_draft_quantize("none", torch.device(device)) is None
        assert resolve_draft_quantize(None, torch.device(device)) is None
        assert resolve_draft_quantize("int4", torch.device(device)) == "int4"
    from flashdesk.engine.cli.main import _parser

    args = _parser().parse_args(["generate", "--model", "m", "--prompt", "p"])
    assert args.draft_quantize == "auto"
