"""`flashdesk generate` and the streaming API, end to end on a tiny checkpoint with its tokenizer."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer

from flashdesk.engine.cli.main import main
from flashdesk.engine.decode.generation import Engine, FinishEvent, GenerationRequest, StepEvent
from tiny_checkpoints import write_checkpoint


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-chat")
    reference = write_checkpoint(folder, "conditional", seed=5)
    return folder, reference


def run_json(capsys, *argv) -> dict:
    assert main(["generate", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("thinking", [False, True])
def test_prompt_ids_are_the_tokenizers_own_chat_template(model_dir, capsys, thinking):
    folder, _ = model_dir
    args = [
        "--model",
        folder,
        "--prompt",
        "Hello there, what is the answer?",
        "--system",
        "Be brief.",
        "--max-new-tokens",
        2,
    ] + (["--thinking"] if thinking else [])
    out = run_json(capsys, *args)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there, what is the answer?"},
    ]
    expected = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, enable_thinking=thinking, tokenize=True, return_dict=False
    )
    assert out["prompt_ids"] == list(expected)
    assert out["prompt_ids"].count(2) == 1  # one <bos>: the template's own
    assert (98 in out["prompt_ids"]) == thinking  # <|think|>


def test_greedy_output_matches_transformers_generate(model_dir, capsys):
    """Our generate, EOS handling included, against transformers' own generate on the same files."""
    folder, reference = model_dir
    prompt = [2, 105, 300, 320, 340, 106, 107, 105, 481, 107]
    out = run_json(capsys, "--model", folder, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", 40)
    with torch.no_grad():
        seq = reference.generate(
            torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=[1, 106, 50], pad_token_id=0
        )[0, len(prompt) :].tolist()
    assert out["prompt_ids"] == prompt
    assert out["token_ids"] == seq
    assert out["finish_reason"] == ("stop" if seq[-1] in (1, 106, 50) else "length")


def test_json_records_every_step(model_dir, capsys):
    folder, _ = model_dir
    out = run_json(capsys, "--model", folder, "--prompt-ids", "2,105,300,106", "--max-new-tokens", 12, "--ignore-eos")
    assert len(out["token_ids"]) == 12 and out["finish_reason"] == "length"
    assert len(out["steps"]) == 11  # the first token comes from the prefill
    assert [t for s in out["steps"] for t in s["emitted"]] == out["token_ids"][1:]
    assert all(s["draft"] == [] and s["accepted"] == 0 for s in out["steps"])
    stats = out["stats"]
    assert stats["prompt_tokens"] == 4 and stats["decode_tokens"] == 11
    assert stats["decode_seconds"] > 0 and stats["decode_tokens_per_second"] > 0
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert out["text"] == tokenizer.decode(out["token_ids"], skip_special_tokens=False)


def test_seeded_sampling_is_reproducible(model_dir, capsys):
    folder, _ = model_dir
    args = [
        "--model",
        folder,
        "--prompt-ids",
        "2,105,300",
        "--max-new-tokens",
        16,
        "--ignore-eos",
        "--temperature",
        1.0,
        "--top-k",
        50,
        "--top-p",
        0.9,
    ]
    first = run_json(capsys, *args, "--seed", 3)["token_ids"]
    assert run_json(capsys, *args, "--seed", 3)["token_ids"] == first
    assert run_json(capsys, *args, "--seed", 4)["token_ids"] != first


def test_context_overflow_is_a_clear_error(model_dir, capsys):
    folder, _ = model_dir
    code = main(
        [
            "generate",
            "--model",
            str(folder),
            "--prompt-ids",
            "2,105,300,301,302",
            "--context",
            "20",
            "--max-new-tokens",
            "16",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "the prompt of 5 tokens plus 16 new tokens needs 21 positions, over the context limit of 20" in err


def test_bad_inputs_are_clear_errors(model_dir, capsys):
    folder, _ = model_dir
    assert main(["generate", "--model", str(folder), "--prompt-ids", "1,x"]) == 2
    assert "comma-separated integers" in capsys.readouterr().err
    assert main(["generate", "--model", str(folder), "--prompt-ids", "2,99999"]) == 2
    assert "token id 99999 is outside the vocabulary" in capsys.readouterr().err


def test_a_missing_model_folder_is_named_as_such(model_dir, tmp_path, capsys, monkeypatch):
    folder, _ = model_dir
    monkeypatch.chdir(tmp_path)
    for name in (str(tmp_path / "nope"), "./nope", "nope", "a/b/nope"):
        assert main(["generate", "--model", name, "--prompt", "hi"]) == 2
        err = capsys.readouterr().err
        assert (
            f"flashdesk generate: error: model folder not found: {tmp_path / name.removeprefix('./')} (give a "
            "folder holding config.json and the weights, or a Hub id such as org/name that `flashdesk models "
            "pull` downloaded)" in err
        ), err
    assert main(["generate", "--model", str(folder), "--draft", str(tmp_path / "nope"), "--prompt", "hi"]) == 2
    assert f"draft model folder not found: {tmp_path / 'nope'}" in capsys.readouterr().err


def test_a_hub_id_not_in_the_cache_keeps_the_hub_advice(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "--model", "org/name", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "run `flashdesk models pull org/name` to download it" in err and "folder not found" not in err


def test_a_file_given_as_the_model_folder(model_dir, capsys):
    folder, _ = model_dir
    assert main(["generate", "--model", str(folder / "config.json"), "--prompt", "hi"]) == 2
    assert (
        f"flashdesk generate: error: model path is a file, not a folder: {folder / 'config.json'} (give the "
        "folder holding config.json and the weights)"
    ) in capsys.readouterr().err


@pytest.fixture
def nothing_loads(monkeypatch):
    """Impossible values must be refused before the model loads."""

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Engine, "load", load)


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--context", "0", "argument --context: must be at least 1, got 0"),
        ("--context", "-4", "argument --context: must be at least 1, got -4"),
        ("--context", "many", "argument --context: not a whole number: 'many'"),
        ("--draft-length", "0", "argument --draft-length: must be at least 1 (or auto), got 0"),
        ("--draft-length", "-2", "argument --draft-length: must be at least 1 (or auto), got -2"),
    ],
)
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_impossible_values_are_refused_by_the_parser(model_dir, nothing_loads, capsys, command, flag, value, message):
    folder, _ = model_dir
    argv = [command, "--model", str(folder), flag, value] + (["--prompt", "hi"] if command == "generate" else [])
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"flashdesk {command}: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--max-new-tokens", "0", "--max-new-tokens must be at least 1, got 0"),
        ("--max-new-tokens", "-1", "--max-new-tokens must be at least 1, got -1"),
        ("--temperature", "-0.5", "temperature must be >= 0, got -0.5"),
        ("--top-p", "0", "top_p must be in (0, 1], got 0.0"),
        ("--top-p", "1.5", "top_p must be in (0, 1], got 1.5"),
        ("--top-k", "-1", "top_k must be >= 0 (0 turns it off), got -1"),
    ],
)
def test_impossible_sampling_values_are_refused_before_loading(model_dir, nothing_loads, capsys, flag, value, message):
    folder, _ = model_dir
    assert main(["generate", "--model", str(folder), "--prompt", "hi", flag, value]) == 2
    assert f"flashdesk generate: error: {message}" in capsys.readouterr().err


def test_stop_strings_end_the_answer_before_them(model_dir):
    folder, _ = model_dir
    engine = Engine.load(folder, device="cpu")
    request = GenerationRequest([2, 105, 300], max_new_tokens=30, ignore_eos=True)
    full = [e for e in engine.generate(request) if isinstance(e, FinishEvent)][0]
    assert len(full.text) > 6
    stop = full.text[3:6]
    events = list(engine.generate(GenerationRequest([2, 105, 300], 30, ignore_eos=True, stop_strings=(stop,))))
    finish = events[-1]
    assert finish.finish_reason == "stop"
    assert finish.text == full.text[: full.text.index(stop)]
    assert "".join(e.answer for e in events if isinstance(e, StepEvent)) == finish.text


def test_thought_is_separated_from_the_answer(model_dir):
    """A reply shaped like Gemma's thinking output, pushed through the engine's text path."""
    from flashdesk.engine.decode.generation import _TextOutput

    folder, _ = model_dir
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = (
        [100]
        + tokenizer.encode("thought\nLet me think", add_special_tokens=False)
        + [101]
        + tokenizer.encode("The answer", add_special_tokens=False)
    )
    out = _TextOutput(tokenizer, ())
    pieces = [out.push([i]) for i in ids]
    answer, thought = out.finish()
    assert "".join(p[1] for p in pieces) + thought == "Let me think"
    assert "".join(p[0] for p in pieces) + answer == "The answer"


def test_the_installed_command_streams_text(model_dir):
    folder, _ = model_dir
    exe = [sys.executable, "-m", "flashdesk"]
    done = subprocess.run(
        exe + ["generate", "--model", str(folder), "--prompt", "Hello", "--max-new-tokens", "8", "--ignore-eos"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "[length] 8 tokens" in done.stderr
    assert done.stdout.strip()


def test_auto_draft_length_from_the_command_line(spec_pair, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHDESK_DATA_DIR", str(tmp_path))
    target_dir, draft_dir = spec_pair[1]
    args = [
        "--model",
        target_dir,
        "--draft",
        draft_dir,
        "--prompt-ids",
        "2,105,300,106",
        "--max-new-tokens",
        24,
        "--ignore-eos",
    ]
    auto = run_json(capsys, *args, "--draft-length", "auto")
    plain = run_json(capsys, *args, "--no-speculate")
    assert auto["token_ids"] == plain["token_ids"] and auto["stats"]["speculative_steps"] > 0
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *map(str, args), "--draft-length", "many"])
    assert exit_info.value.code == 2 and "not a whole number (or auto): 'many'" in capsys.readouterr().err


def test_the_version_and_the_demo_pair_need_no_model_folder(capsys):
    """`flashdesk --version` names the installed version; `generate --demo` runs the demo pair (made
    in the data folder from the package's own copy) without --model or --draft."""
    import importlib.metadata

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"flashdesk {importlib.metadata.version('flashdesk')}"
    assert (
        main(
            [
                "generate",
                "--demo",
                "--prompt",
                "def fib(n):",
                "--max-new-tokens",
                "6",
                "--ignore-eos",
                "--device",
                "cpu",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(out["token_ids"]) == 6 and out["steps"]
    assert out["stats"]["acceptance_rate"] is not None  # the demo's drafter came with it
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "x"])
    assert "--model (or use --demo)" in capsys.readouterr().err
