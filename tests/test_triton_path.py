"""The Triton path end to end, interpreted on the CPU: the int4 fixtures give the same greedy tokens
as the torch path and as transformers, speculation on equals off, and a step reads nothing back to
the host but its tokens."""

import pytest
import torch

from flashdesk.engine.decode.generation import Engine, GenerationRequest
from flashdesk.engine.decode.sampling import SamplingParams
from flashdesk.engine.decode.speculative import Decoder, SpecControl
from flashdesk.kernels.backend import describe, kernels
from tiny_drafter import PROMPTS, write_drafter
from tiny_int4 import write_int4_checkpoint

pytest.importorskip("compressed_tensors")
pytest.importorskip("triton")

VARIANTS = [
    ("conditional", "fused", True),
    ("causal", "per_expert", False),
    ("conditional", "per_expert", False),
    ("causal", "fused", True),
]
TOKENS = 16  # new tokens per run; 24 took half as long again under the interpreter


@pytest.fixture(scope="module", params=VARIANTS, ids=["-".join(map(str, v)) for v in VARIANTS])
def int4_pair(request, tmp_path_factory):
    layout, experts, symmetric = request.param
    target, drafter = tmp_path_factory.mktemp("int4-target"), tmp_path_factory.mktemp("int4-drafter")
    reference = write_int4_checkpoint(target, layout, experts, symmetric, seed=3)
    write_drafter(drafter, seed=2, target=reference)
    return target, drafter, reference


def generate(engine, prompt, n, control=None):
    events = list(engine.generate(GenerationRequest(prompt, n, ignore_eos=True), control))
    return events[-1]


def reference_greedy(reference, prompt, n):
    with torch.no_grad():
        seq = reference.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return seq[0, len(prompt) :].tolist()


def test_triton_path_equals_transformers_and_the_torch_path(int4_pair):
    target, drafter, reference = int4_pair
    prompt = PROMPTS[0]
    fp32 = Engine.load(target, device="cpu", kv_dtype="float32", draft_dir=drafter)
    with kernels("triton"):
        assert generate(fp32, prompt, TOKENS, SpecControl(False)).token_ids == reference_greedy(
            reference, prompt, TOKENS
        )

    fp8 = Engine.load(target, device="cpu", kv_dtype="fp8", draft_dir=drafter)
    with kernels("torch"):
        torch_tokens = generate(fp8, prompt, TOKENS, SpecControl(False)).token_ids
    with kernels("triton"):
        plain = generate(fp8, prompt, TOKENS, SpecControl(False))
        assert plain.stats["kernels"] == "triton (interpreter)"
        assert plain.token_ids == torch_tokens
        accepted = 0
        for k in (7, 15):  # K=1: the test below
            spec = generate(fp8, prompt, TOKENS, SpecControl(True, k))
            assert spec.token_ids == plain.token_ids, f"speculation changed the output at K={k}"
            accepted += spec.stats["accepted"]
    assert accepted > 0  # the trained drafter really gets drafts through the Triton verify


def test_one_draft_a_step_on_the_triton_path_changes_nothing(int4_pair):
    """K=1, the smallest verify block (two rows), one step per token or two: the slowest of the
    draft lengths under the interpreter, so apart from the one variant in the default tier."""
    target, drafter, _ = int4_pair
    prompt = PROMPTS[0]
    fp8 = Engine.load(target, device="cpu", kv_dtype="fp8", draft_dir=drafter)
    with kernels("torch"):
        plain = generate(fp8, prompt, TOKENS, SpecControl(False)).token_ids
    with kernels("triton"):
        spec = generate(fp8, prompt, TOKENS, SpecControl(True, 1))
    assert spec.stats["kernels"] == "triton (interpreter)"
    assert spec.token_ids == plain, "speculation changed the output at K=1"
    assert spec.stats["accepted"] > 0


def test_kernels_are_named_for_each_choice():
    with kernels("torch"):
        assert describe("cpu") == "torch"
    with kernels("triton"):
        assert describe("cpu") == "triton (interpreter)"
    assert describe("cpu") == "torch"  # the CPU default


@pytest.mark.parametrize("choice", ["torch", "triton"])
@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=1)], ids=["greedy", "sampled"]
)
def test_a_step_reads_back_only_its_tokens(spec_pair, choice, sampling, forbid_reads):
    engine = spec_pair[0]
    with kernels(choice):
        decoder = Decoder(engine.model, engine.drafter, 64, "fp8", sampling, set())
        decoder.prefill(PROMPTS[2])
        forbid_reads["armed"] = True
        for control in (SpecControl(False), SpecControl(True, 7), SpecControl(True, 15), SpecControl(False)):
            before = forbid_reads["reads"]
            result = decoder.step(32, control)
            assert forbid_reads["reads"] - before == 1
            assert result.emitted
        forbid_reads["armed"] = False


def test_the_drafters_triton_path_computes_its_torch_path(spec_pair):
    """Context K/V stored by the q/k norm kernel (in two updates, the second at the held length),
    the fused Qwen3 norms, q/k/v projection and RoPE: the same draft logits as the torch path."""
    drafter = spec_pair[0].drafter
    taps = torch.randn(21, drafter.fc.shape[1], generator=torch.Generator().manual_seed(4)).to(drafter.dtype)
    logits = {}
    for choice in ("torch", "triton"):
        ctx = drafter.new_context(64)
        with kernels(choice):
            drafter.add_context(ctx, taps[:13])
            drafter.add_context(ctx, taps[13:])
            ctx.note_block(8)
            logits[choice] = drafter.draft_logits(ctx, 300, 7)
    torch.testing.assert_close(logits["triton"], logits["torch"], rtol=1e-4, atol=1e-4)
    assert logits["torch"].abs().max() > 1  # logits, not zeros


def test_writing_a_blocks_context_before_its_read_changes_no_draft(spec_pair):
    """On the Triton path a verified block's drafter context is written for all its rows before the
    host learns how many were accepted; the rows not kept are overwritten later. Every draft of a
    speculative run is the same as when only the accepted rows are written, after the read."""
    engine = spec_pair[0]
    runs = {}
    with kernels("triton"):
        for ahead in (True, False):
            decoder = Decoder(engine.model, engine.drafter, 96, "fp8", SamplingParams(), set())
            assert decoder.context_ahead  # the Triton path writes ahead unless told not to
            decoder.context_ahead = ahead
            decoder.prefill(PROMPTS[1])
            steps = [decoder.step(64, SpecControl(True, k)) for k in (15, 3, 15, 7, 15)]
            steps.append(decoder.step(64, SpecControl(False)))  # a plain step's features wait, then go in
            steps.append(decoder.step(64, SpecControl(True, 15)))
            assert bool(decoder.pending) != ahead  # written ahead: nothing waits
            decoder.flush_pending()
            assert decoder.ctx.length == decoder.cache.length  # every position the target ran
            runs[ahead] = [(s.draft, s.emitted) for s in steps]
    assert runs[True] == runs[False]
    assert sum(len(emitted) for _, emitted in runs[True]) > len(runs[True])  # drafts were accepted


@pytest.mark.parametrize("choice", ["torch", "triton"])
def test_the_drafters_context_write_reads_its_start_on_the_device(spec_pair, choice):
    """write_context takes its start from the context's device position, never the host length, so
    a CUDA graph of it replays at any length."""
    drafter = spec_pair[0].drafter
    taps = torch.randn(21, drafter.fc.shape[1], generator=torch.Generator().manual_seed(5)).to(drafter.dtype)
    contexts = [drafter.new_context(64), drafter.new_context(64)]
    with kernels(choice):
        for ctx in contexts:
            drafter.add_context(ctx, taps[:13])
        drafter.add_context(contexts[0], taps[13:])
        contexts[1].length = 0  # stale on the host, as a captured graph's would be
        drafter.write_context(contexts[1], taps[13:])
    for k0, k1 in zip(contexts[0].k + contexts[0].v, contexts[1].k + contexts[1].v):
        assert torch.equal(k0, k1)
    assert contexts[0].k[0][13:21].abs().sum() > 0  # the write really stored the last 8 positions
