"""The shipped demo pair (assets/demo_model/, trained by packaging/train_demo.py; issue 10 item 5).

It must be what the app says it is: a Gemma 4 of the 26B-A4B's architecture and a DFlash drafter
for it, small enough to ship, loaded by the engine's normal path; speculation must change nothing
in greedy output, and the trained drafter must really be accepted on code (no timing here: the
speedup is measured with `flashdesk bench`, see assets/demo_model/NOTICE.md). Nothing is trained here.
"""

from __future__ import annotations

import json

import pytest

from flashdesk.engine.hub.demo import DEMO_ASSETS, create_demo

MAX_BYTES = 30_000_000
CODE_PROMPTS = [
    "Write a Python function to return the n-th Fibonacci number.",
    "Write a Python function that reads a file and returns the number of lines in it.",
    "Implement a class Stack in Python with push and pop methods.",
]


def test_the_shipped_pair_is_a_gemma4_target_and_a_dflash_drafter_within_30_mb() -> None:
    from flashdesk.engine.model.config import FULL, SLIDING, check_pair, load_config, load_draft_config

    files = [f for f in DEMO_ASSETS.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) <= MAX_BYTES
    raw = json.loads((DEMO_ASSETS / "target" / "config.json").read_text())
    assert raw["architectures"] == ["Gemma4ForCausalLM"] and raw["model_type"] == "gemma4_text"
    target = load_config(DEMO_ASSETS / "target")
    assert {layer.kind for layer in target.layers} == {SLIDING, FULL}
    assert target.enable_moe and target.num_experts > target.top_k_experts > 1
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (DEMO_ASSETS / "target" / name).is_file(), name
    raw = json.loads((DEMO_ASSETS / "drafter" / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"] and raw["block_size"] == 16
    draft = load_draft_config(DEMO_ASSETS / "drafter")
    check_pair(target, draft)
    assert max(draft.target_layer_ids) < target.num_layers - 1  # never the last layer
    notice = (DEMO_ASSETS / "NOTICE.md").read_text()
    assert "Python Software Foundation" in notice and "train_demo.py" in notice


def test_the_demo_is_named_as_the_demo_not_after_its_target_folder(tmp_path) -> None:
    """The model name a reply and an export carry, and the server's model id, say which model wrote it."""
    from flashdesk.engine.loading.model_card import DEMO_NAME, model_name

    target, drafter = create_demo(tmp_path / "demo")
    assert model_name(target) == DEMO_NAME and model_name(drafter) == "drafter"
    (tmp_path / "target").mkdir()
    assert model_name(tmp_path / "target") == "target"  # a folder of that name alone is not the demo


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from flashdesk.engine.decode.generation import Engine

    target, drafter = create_demo(tmp_path_factory.mktemp("demo-pair"))
    return Engine.load(target, device="cpu", draft_dir=drafter)


def _ids(engine, prompt: str) -> list[int]:
    from flashdesk.engine.decode.chat_format import build_prompt_ids, messages_from

    return build_prompt_ids(engine.tokenizer, messages_from(prompt), enable_thinking=False)


def test_greedy_output_is_the_same_with_dflash_and_its_drafts_are_accepted_on_code(engine) -> None:
    from flashdesk.engine.decode.generation import GenerationRequest
    from flashdesk.engine.decode.speculative import SpecControl

    steps = emitted = 0
    for prompt in CODE_PROMPTS:
        request = GenerationRequest(_ids(engine, prompt), max_new_tokens=96)
        off = list(engine.generate(request, SpecControl(enabled=False)))[-1]
        on = list(engine.generate(request, SpecControl(enabled=True, draft_length=8)))[-1]
        assert on.token_ids == off.token_ids and on.text == off.text
        steps += on.stats["speculative_steps"]
        emitted += on.stats["speculative_emitted"]
    # tokens per target pass: 1 without speculation; a drafter that had learnt nothing stays near 1
    assert emitted / steps >= 2.5, emitted / steps


def test_the_demo_answers_a_code_request_with_python(engine) -> None:
    from flashdesk.engine.decode.generation import GenerationRequest

    reply = list(engine.generate(GenerationRequest(_ids(engine, CODE_PROMPTS[0]), max_new_tokens=120)))[-1].text
    assert "def " in reply and "return" in reply, reply
