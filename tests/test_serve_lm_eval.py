"""EleutherAI's lm-eval against `flashdesk serve --demo` (issue 34): its `local-completions` model runs a
loglikelihood task (three multiple-choice questions in a task file of its own) through /v1/completions,
and each choice's loglikelihood it reports equals one forward pass of the model over the same tokens.
In the slow tier (conftest.py): lm-eval is heavy to import and not a test dependency; without it the
test is skipped, and test_serve_logprobs.py makes the same requests over plain HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from flashdesk.engine.hub.demo import create_demo

WHY = "lm-eval[api] is not installed (pip install 'lm-eval[api]'); test_serve_logprobs.py makes its requests"
pytest.importorskip("lm_eval", reason=WHY)
pytest.importorskip("tenacity", reason=WHY)  # what its API models need beside it

DOCS = [
    {"question": "Question: Which keyword defines a function in Python?\nAnswer:", "choices": ["def", "fn", "lambda"]},
    {"question": "Question: What does len([1, 2, 3]) return?\nAnswer:", "choices": ["3", "2", "None"], "answer": 0},
    {"question": "Question: Which module reads JSON?\nAnswer:", "choices": ["csv", "json", "pickle"], "answer": 1},
]
TASK = """task: flashdesk_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: question
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def _serve(env: dict) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flashdesk", "serve", "--demo", "--port", "0", "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stdout.readline()
    assert line.startswith("flashdesk serve: flashdesk-demo at http://"), line + proc.stderr.read()
    return proc, line.split(" at ")[1].split(" ")[0]  # .../v1


def test_lm_eval_local_completions_loglikelihoods_are_the_models(tmp_path) -> None:
    from flashdesk.engine.decode.generation import Engine

    target, _ = create_demo(tmp_path / "demo")
    data = tmp_path / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps({"answer": 0, **doc}) + "\n" for doc in DOCS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "flashdesk_tiny_mc.yaml").write_text(TASK.format(data=data))
    env = {
        **os.environ,
        "FLASHDESK_DATA_DIR": str(tmp_path / "data"),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
        "PYTHONUNBUFFERED": "1",
    }
    server, base = _serve(env)
    try:
        model_args = (
            f"model=flashdesk-demo,base_url={base}/completions,tokenizer={target},tokenizer_backend=huggingface,"
            "add_bos_token=True,num_concurrent=1,max_retries=1,max_length=2048"
        )
        run = subprocess.run(
            [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args]
            + ["--tasks", "flashdesk_tiny_mc", "--include_path", str(tasks), "--log_samples"]
            + ["--output_path", str(tmp_path / "out")],
            env=env,
            cwd=tmp_path,  # not the checkout, whose kernels/ would shadow the `kernels` package transformers imports
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        server.terminate()
        server.wait(60)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-6000:]
    files = list((tmp_path / "out").rglob("samples_flashdesk_tiny_mc_*.jsonl"))
    samples = [json.loads(line) for path in files for line in path.read_text().splitlines()]
    assert len(samples) == len(DOCS)

    engine = Engine.load(target, device="cpu")
    tokenizer = engine.tokenizer
    for sample in samples:
        doc = sample["doc"]
        for choice, response in zip(doc["choices"], sample["resps"]):
            loglikelihood, greedy = float(response[0][0]), response[0][1] == "True"  # written as strings
            context = tokenizer(doc["question"], add_special_tokens=True)["input_ids"]
            ids = tokenizer(doc["question"] + " " + choice, add_special_tokens=True)["input_ids"]
            cache = engine.model.new_cache(len(ids) + 16, engine.kv_dtype)
            with torch.inference_mode():
                logits = engine.model.forward(torch.tensor(ids), cache, logits_rows="all").logits
            logp = torch.log_softmax(logits.float(), dim=-1)
            positions = range(len(context), len(ids))
            assert abs(loglikelihood - sum(logp[i - 1, ids[i]].item() for i in positions)) < 1e-3, (doc, choice)
            assert greedy == all(logp[i - 1].argmax().item() == ids[i] for i in positions)
