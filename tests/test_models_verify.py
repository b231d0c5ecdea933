"""`flashdesk models verify PATH_OR_REPO`: what the engine would make of a checkpoint, read from its
configs and safetensors headers alone: on the test fixtures, on the real model's configs (the ones
the synthetic bench builds) with every tensor announced at its real size but no byte read, and on a
Hub repository before its weights are downloaded (the fake Hub), which is what a pull and the
setup page show while the weights come."""

import json
import struct

import pytest

from flashdesk import protocol as p
from flashdesk.engine.model import known_models
from flashdesk.engine.hub import models
from flashdesk.engine.hub.verify import check_snapshot, verify
from flashdesk.engine.loading.memory_plan import int4_weight_bytes
from flashdesk.engine.loading.weights import expected_shapes
from flashdesk.engine.model.config import parse_config
from flashdesk.engine.model.drafter import draft_expected_shapes
from flashdesk.engine.model.config import parse_draft_config
from flashdesk.engine.cli.main import main
from tiny_int4 import weights_json, write_int4_checkpoint

pytest.importorskip("compressed_tensors")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verify-tiny")
    write_int4_checkpoint(folder, "conditional", "per_expert", False, seed=4)
    return folder


def test_a_fixture_verifies_with_its_formats_kernels_and_plan(tiny, capsys):
    assert main(["models", "verify", str(tiny), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["kind"] == "target" and out["problems"] == []
    formats = {(f["weights"], f["format"]): f["modules"] for f in out["formats"]}
    assert formats[("experts", "int4 group 8, asymmetric")] == 12  # 6 layers x gate_up, down
    assert formats[("linear", "16-bit")] == 3  # layer 0's MLP, listed in `ignore`
    assert {k["family"] for k in out["kernels"]} == {"linear", "moe", "decode_attention"}
    assert all(k["runs_on"] == "torch" for k in out["kernels"])  # no GPU here
    assert out["memory"]["context"] == 4096 and out["memory"]["bytes"] > 0

    assert main(["models", "verify", str(tiny)]) == 0
    text = capsys.readouterr().out
    assert "kernels" in text and "verdict    ok" in text


def test_what_the_engine_would_refuse_is_named(tiny, tmp_path, capsys):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "m"
    shutil.copytree(tiny, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.language_model.layers.3.self_attn.q_proj.weight_g_idx"] = torch.zeros(64, dtype=torch.int32)
    save_file(tensors, str(folder / "model.safetensors"))
    assert main(["models", "verify", str(folder), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["ok"] and "layers.3.self_attn.q_proj.weight_g_idx" in out["problems"][0]
    assert main(["models", "verify", str(tmp_path / "nowhere")]) == 1
    assert "not a Hugging Face model id" in capsys.readouterr().out


# --- the real configs, every tensor at its real size, no byte of them read -----------------------------


def write_headers_only(folder, tensors: dict[str, tuple[str, tuple]], config: dict) -> None:
    """A safetensors file whose header announces `tensors` {name: (dtype, shape)} at their real
    sizes, its data section a hole (a sparse file: nothing written, nothing to read), and config.json."""
    sizes = {"BF16": 2, "I32": 4, "I64": 8}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    (folder / "config.json").write_text(json.dumps(config))


def real_target_tensors(experts: str, bf16_mlp_layers: range) -> tuple[dict, dict]:
    """The real target as a compressed-tensors export: int4 group 32 symmetric linears and experts
    (fused or per expert), the dense MLP of `bf16_mlp_layers` left in bf16."""
    raw = known_models.target_raw()
    cfg = parse_config(raw)
    tensors = {}
    for name, shape in expected_shapes(cfg).items():
        full = "model." + name
        quantized = name.endswith(("_proj.weight", "experts.gate_up_proj", "experts.down_proj"))
        if ".mlp." in name and int(name.split(".")[1]) in bf16_mlp_layers:
            quantized = False
        if not quantized:
            tensors[full] = ("BF16", shape)
            continue
        if name.endswith(".weight"):
            stems = [(full.removesuffix("weight") + "weight_", shape)]
        elif experts == "fused":
            stems = [(full + "_", shape)]
        else:
            layer = full.rsplit("experts.", 1)[0] + "experts."
            parts = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
            rows = shape[1] // len(parts)
            stems = [(f"{layer}{e}.{part}.weight_", (rows, shape[2])) for e in range(shape[0]) for part in parts]
        for stem, (*lead, out, k) in stems:
            tensors[stem + "packed"] = ("I32", (*lead, out, k // 8))
            tensors[stem + "scale"] = ("BF16", (*lead, out, k // 32))
            tensors[stem + "shape"] = ("I64", (len(lead) + 2,))
    ignore = ["lm_head", "re:.*router.*"] + [
        f"model.layers.{i}.mlp.{p}" for i in bf16_mlp_layers for p in ("gate_proj", "up_proj", "down_proj")
    ]
    raw = dict(
        raw,
        quantization_config={
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights_json(True, 32)}},
            "ignore": ignore,
        },
    )
    return tensors, raw


@pytest.fixture
def no_weights_read(monkeypatch):
    """Fail on any read of tensor data (the loader's safetensors reader)."""
    import safetensors

    def refuse(*args, **kwargs):
        raise AssertionError("models verify read weights")

    monkeypatch.setattr(safetensors, "safe_open", refuse)
    monkeypatch.setattr("flashdesk.engine.loading.weights.safe_open", refuse)


@pytest.mark.parametrize(
    "experts, bf16_mlps",
    [("fused", range(0)), ("per_expert", range(29))],
    ids=["as-the-synthetic-bench-builds-it", "per-expert-bf16-dense-mlps"],
)
def test_the_real_configs_verify_from_headers_alone(tmp_path, no_weights_read, experts, bf16_mlps):
    tensors, raw = real_target_tensors(experts, bf16_mlps)
    write_headers_only(tmp_path, tensors, raw)
    result = verify(str(tmp_path), context=8192)
    assert result.ok, result.problems
    formats = {(f["weights"], f["format"]): f["modules"] for f in result.formats}
    assert formats[("experts", "int4 group 32, symmetric")] == 60
    assert formats.get(("linear", "16-bit"), 0) == 3 * len(bf16_mlps)  # gate, up and down as stored
    assert result.memory["context"] == 8192
    if not bf16_mlps:  # the plan holds the bytes the synthetic bench loads (int4 everywhere it can be)
        from flashdesk.engine.loading.checkpoint import inspect_checkpoint

        report = inspect_checkpoint(tmp_path, 8192, device="cpu")
        assert report.loaded_bytes == pytest.approx(int4_weight_bytes(parse_config(raw), 32, 4), rel=0.01)


def test_the_real_drafter_config_verifies_from_headers_alone(tmp_path, no_weights_read):
    raw = known_models.draft_raw()
    dcfg = parse_draft_config(raw)
    tensors = {name: ("BF16", shape) for name, shape in draft_expected_shapes(dcfg).items()}
    write_headers_only(tmp_path, tensors, raw)
    result = verify(str(tmp_path))
    assert result.ok and result.kind == "drafter", result.problems
    assert "DFlash, 5 layers, block 16" in "\n".join(result.lines)


# --- a Hub repository before its weights are downloaded ----------------------------------------------


@pytest.fixture
def hub(tiny, tmp_path, monkeypatch):
    from fake_hub import FakeHub

    files = {f.name: f.read_bytes() for f in tiny.iterdir() if f.is_file()}
    with FakeHub() as server:
        server.add_repo("org/tiny-int4", files)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def test_a_hub_id_verifies_before_any_weights_file_is_downloaded(hub, capsys):
    assert main(["models", "verify", "org/tiny-int4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["kind"] == "target", out["problems"]
    snapshot = models.hub_cache_dir() / "models--org--tiny-int4" / "snapshots"
    assert not list(snapshot.glob("*/*.safetensors"))  # only the small files came
    gets = [(path, rng) for method, path, rng in hub.log if method == "GET" and path.endswith(".safetensors")]
    assert gets and all(rng.startswith("bytes=") and not rng.endswith("-") for _, rng in gets)  # bounded reads


def test_a_pull_says_what_the_engine_would_make_of_it_before_the_weights(hub):
    seen = []

    def checked(repo_id, snapshot):
        assert not list(snapshot.glob("*.safetensors"))  # before the weights
        seen.append(check_snapshot(repo_id, snapshot))

    entry = models.pull("org/tiny-int4", show_progress=False, log=lambda s: None, checked=checked)
    assert entry.complete
    assert len(seen) == 1 and seen[0].ok and seen[0].kernels


def test_the_setup_page_shows_a_refusal_while_the_download_runs(qtbot):
    from flashdesk.app.pages.setup_page import SetupPage

    page = SetupPage()
    qtbot.addWidget(page)
    page.set_downloading(True)
    msg = p.PullChecked("org/odd", ["config  ...", "verdict  NOT usable: 1 problem"], ["unexpected tensor x"])
    page.show_pull_check(msg.repo_id, msg.lines, msg.problems)
    page.show_download("org/odd", "model.safetensors", 10, 100)
    assert "would refuse this model: unexpected tensor x" in page.status.text()
    assert "checked before its weights" in page.plan.toPlainText()
    page.set_downloading(False)
    page.set_downloading(True)  # the next download starts clean
    page.show_download("org/other", "model.safetensors", 10, 100)
    assert "refuse" not in page.status.text()


@pytest.mark.parametrize("ignore_range", [False, True], ids=["ranged", "server-ignores-range"])
def test_a_header_longer_than_the_first_read_comes_in_a_second(hub, monkeypatch, ignore_range):
    from flashdesk.engine.hub import verify as verify_module

    monkeypatch.setattr(verify_module, "HEADER_PROBE", 64)
    hub.ignore_range = ignore_range
    result = verify("org/tiny-int4")
    assert result.ok, result.problems
    ranges = [rng for method, path, rng in hub.log if method == "GET" and path.endswith(".safetensors")]
    assert ranges[:2] == ["bytes=0-63", f"bytes=64-{int(ranges[1].split('-')[1])}"]


def test_a_check_that_cannot_be_made_proves_nothing_and_stops_nothing(hub, tmp_path):
    result = check_snapshot("org/tiny-int4", tmp_path)  # no cached file list for this "snapshot"
    assert not result.checked and result.ok and "not checked before the download" in result.lines[0]


def test_models_pull_says_what_it_found_before_the_weights(hub, capsys):
    assert main(["models", "pull", "org/tiny-int4"]) == 0
    err = capsys.readouterr().err
    assert "org/tiny-int4: checked from its configs and headers: FlashDesk can run it" in err
