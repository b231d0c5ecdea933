"""Gemma 4's MTP assistant beside the recommended pair (issue 32): its real config as data, checked
against the real target and against transformers' own model of it; `models pull` offering it; and
the survey's fit of the pair with it, in the form the worker sends to the window.

The Hub is the fake one (tests/fake_hub.py) serving a tiny target, drafter and assistant under the
real ids; the real Hub is never contacted."""

from __future__ import annotations

import json
import math

import pytest
from fake_hub import FakeHub, point_at

from flashdesk import protocol as p
from flashdesk.engine.cli.main import main
from flashdesk.engine.errors import ConfigError
from flashdesk.engine.hub import models, recommended
from flashdesk.engine.model import known_models
from flashdesk.engine.model.assistant import assistant_expected_shapes, check_assistant_pair, parse_assistant_config
from flashdesk.engine.model.config import parse_config

GIB = 1024**3
TARGET, DRAFT = models.DEFAULT_REPOS
ASSISTANT = models.ASSISTANT_REPO


# -- the real config ----------------------------------------------------------------------------------


def test_the_real_assistant_parses_and_fits_the_real_target():
    cfg = parse_assistant_config(known_models.assistant_raw())
    target = parse_config(known_models.target_raw())
    check_assistant_pair(target, cfg, "the real assistant")  # raises if it attends over K/V the target lacks
    assert cfg.backbone_hidden_size == target.hidden_size == 2816
    assert cfg.text.vocab_size == target.vocab_size == 262144
    assert (cfg.text.hidden_size, cfg.text.num_layers, cfg.text.intermediate_size) == (1024, 4, 8192)
    assert [layer.kind for layer in cfg.text.layers] == ["sliding_attention"] * 3 + ["full_attention"]
    assert [(layer.num_kv_heads, layer.head_dim) for layer in cfg.text.layers] == [(8, 256)] * 3 + [(2, 512)]
    assert cfg.text.num_heads == 16 and cfg.text.sliding_window == 1024
    assert not cfg.use_ordered_embeddings and cfg.text.final_logit_softcapping is None
    # its bf16 weights: 0.84 GB, the size of the published bf16 copies (839 MB)
    params = sum(math.prod(shape) for shape in assistant_expected_shapes(cfg).values())
    assert 839e6 <= 2 * params < 840e6
    assert models.ASSISTANT_BYTES >= 2 * params


def test_an_assistant_for_another_target_is_refused_by_the_same_check():
    target = parse_config(known_models.target_raw())
    for change in ({"backbone_hidden_size": 1536}, {"text_config": {"num_global_key_value_heads": 4}}):
        raw = known_models.assistant_raw()
        raw.update({k: v for k, v in change.items() if k != "text_config"})
        raw["text_config"].update(change.get("text_config", {}))
        with pytest.raises(ConfigError):
            check_assistant_pair(target, parse_assistant_config(raw), "a wrong assistant")


def test_transformers_builds_the_same_tensors_from_the_real_config():
    """transformers' Gemma4AssistantConfig takes the table as is (its own validation included) and
    its model holds exactly the tensors the engine expects, at the same shapes."""
    import torch
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    raw = known_models.assistant_raw()
    config = Gemma4AssistantConfig.from_dict(raw)
    config.validate_architecture()
    assert config.text_config.num_kv_shared_layers == config.text_config.num_hidden_layers == 4
    with torch.device("meta"):
        model = Gemma4AssistantForCausalLM(config)
    theirs = {name.removeprefix("model."): tuple(t.shape) for name, t in model.state_dict().items()}
    theirs.pop("lm_head.weight")  # tied to the embedding
    assert theirs == assistant_expected_shapes(parse_assistant_config(raw))


def test_a_swap_of_the_table_includes_the_assistant_when_given():
    small = dict(known_models.REAL_ASSISTANT, backbone_hidden_size=64)
    with known_models.shapes(known_models.REAL_TARGET, known_models.REAL_DRAFTER, small):
        assert known_models.assistant_raw()["backbone_hidden_size"] == 64
    with known_models.shapes(known_models.REAL_TARGET, known_models.REAL_DRAFTER):
        assert known_models.assistant_raw()["backbone_hidden_size"] == 2816
    assert known_models.assistant_raw()["backbone_hidden_size"] == 2816
    known_models.assistant_raw()["text_config"]["hidden_size"] = 1  # a copy: the table is untouched
    assert known_models.REAL_ASSISTANT["text_config"]["hidden_size"] == 1024


# -- models pull ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """The files of a tiny target, drafter and assistant, as {path: bytes} each."""
    from tiny_assistant import write_assistant
    from tiny_checkpoints import write_checkpoint
    from tiny_drafter import write_drafter

    folders = [tmp_path_factory.mktemp(name) for name in ("target", "draft", "assistant")]
    write_checkpoint(folders[0])
    write_drafter(folders[1], seed=3)
    write_assistant(folders[2], seed=5)
    return [{q.name: q.read_bytes() for q in sorted(folder.iterdir()) if q.is_file()} for folder in folders]


@pytest.fixture
def hub(trio, tmp_path, monkeypatch):
    with FakeHub() as server:
        for repo, files in zip((TARGET, DRAFT, ASSISTANT), trio):
            server.add_repo(repo, files)
        point_at(server, tmp_path, monkeypatch)
        yield server


def test_pull_offers_the_assistant_until_it_is_here(hub, capsys):
    assert main(["models", "pull"]) == 0
    out = capsys.readouterr().out
    assert f"{TARGET}: complete" in out and f"{DRAFT}: complete" in out
    offer = [line for line in out.splitlines() if "MTP assistant" in line]
    assert offer == [models.assistant_offer([TARGET, DRAFT])]
    assert offer[0].endswith(f"flashdesk models pull {ASSISTANT}") and "(0.84 GB)" in offer[0]
    assert not any(ASSISTANT in path for _, path, _ in hub.log)  # offered, not downloaded

    assert main(["models", "pull", ASSISTANT]) == 0  # the same pull path as any model
    out = capsys.readouterr().out
    assert f"{ASSISTANT}: complete" in out and "MTP assistant" not in out
    assert main(["models", "pull", TARGET]) == 0
    assert "MTP assistant" not in capsys.readouterr().out  # on disk now: nothing to offer

    assert main(["models", "list", "--json"]) == 0
    kinds = {e["name"]: (e["kind"], e["complete"]) for e in json.loads(capsys.readouterr().out)}
    assert kinds == {TARGET: ("target", True), DRAFT: ("drafter", True), ASSISTANT: ("assistant", True)}


def test_no_offer_for_other_models(hub):
    assert models.assistant_offer(["someone/else"]) is None
    assert models.assistant_offer([]) is None
    assert models.assistant_offer([DRAFT, ASSISTANT]) is None
    assert ASSISTANT in (models.assistant_offer([DRAFT]) or "")


# -- the survey ----------------------------------------------------------------------------------------


def test_the_fit_with_the_assistant_adds_its_weights_to_the_plan():
    big, snug = ("RTX 4090", int(23.5 * GIB), 24 * GIB), ("RTX 4090", int(16.6 * GIB), 24 * GIB)
    pair, both = recommended.recommended_fit(big), recommended.assistant_fit(big)
    assert both["repo"] == ASSISTANT and both["download_bytes"] == models.ASSISTANT_BYTES
    added = both["needed_bytes"] - pair["needed_bytes"]
    assert 839e6 <= added < 840e6  # the assistant's bf16 weights; it keeps no context of its own
    assert both["fits"] and both["context"] == 32768 and "with the MTP assistant" in both["text"]
    # a card the pair fits and the three do not: each says so
    assert recommended.recommended_fit(snug)["fits"]
    tight = recommended.assistant_fit(snug)
    assert not tight["fits"] and tight["context"] == 0
    assert tight["text"].startswith("Does not fit") and "the pair with the MTP assistant needs" in tight["text"]
    assert "the pair with the MTP assistant" in recommended.assistant_fit(None)["text"]


def test_the_survey_goes_through_the_workers_message(monkeypatch, tmp_path):
    """The worker sends `Surveyed(**survey.as_dict())`: the message carries the assistant's fit."""
    monkeypatch.setenv(recommended.FAKE_GPU_ENV, "RTX 4090,23.5,24")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    found = recommended.survey()
    assert found.assistant["repo"] == ASSISTANT and found.assistant["fits"]
    assert found.recommended == list(models.DEFAULT_REPOS)
    sent = p.decode(p.encode(p.Surveyed(**found.as_dict())))
    assert sent.assistant == found.assistant
