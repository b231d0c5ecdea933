"""`flashdesk doctor --model`: the checkpoint check and its memory figures.

The KV figure is held equal to what the engine's cache really allocates, and to a hand computation
for the real Gemma 4 26B-A4B; the weight figures to what the loader really holds. A broken folder
must produce the loader's message as a problem line and a non-zero exit, never a traceback.
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashdesk.engine.loading.build import load_target
from flashdesk.engine.loading.checkpoint import describe_checkpoint, inspect_checkpoint
from flashdesk.engine.loading.memory_plan import (
    MIN_USEFUL_CONTEXT,
    WORKSPACE_FIXED_BYTES,
    format_bytes,
    int4_weight_bytes,
    kv_cache_bytes,
    loaded_weight_bytes,
    longest_context,
    plan_memory,
    workspace_bytes,
)
from flashdesk.engine.decode.speculative import PREFILL_CHUNK
from flashdesk.engine.cli import doctor as doctor_tool
from flashdesk.engine.model import known_models
from flashdesk.engine.model.known_models import draft_raw
from flashdesk.engine.cli.main import main
from flashdesk.engine.model.config import parse_config, parse_draft_config
from flashdesk.engine.model.gemma4 import Gemma4
from flashdesk.engine.loading.weights import TOWER_PREFIXES
from tiny_checkpoints import TINY_TEXT_CONFIG, write_checkpoint

WINDOW = TINY_TEXT_CONFIG["sliding_window"]
GIB = 1024**3
TINY_LIMIT = TINY_TEXT_CONFIG["max_position_embeddings"]


# -- KV bytes against the real cache ----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kv-bytes")
    write_checkpoint(folder, "causal", seed=3, tokenizer=False)
    return load_target(folder)


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float32", "fp8"])
@pytest.mark.parametrize("context", [1, 5, WINDOW, WINDOW + 16, WINDOW + 17, 100, 1000])
@pytest.mark.parametrize("slack", [16, 0, 3])
def test_kv_cache_bytes_equals_what_the_cache_allocates(tiny_model, kv_dtype, context, slack):
    """Contexts below, at and above the ring size (window + slack) of the sliding layers."""
    cache = tiny_model.new_cache(context, kv_dtype, slack)
    assert kv_cache_bytes(tiny_model.cfg, context, kv_dtype, slack) == cache.nbytes()


def test_kv_cache_bytes_refuses_unknown_dtypes(tiny_model):
    with pytest.raises(ValueError, match="unknown KV storage dtype 'int4'"):
        kv_cache_bytes(tiny_model.cfg, 16, "int4")


# -- the real Gemma 4 26B-A4B, as Gemma4ForConditionalGeneration's config.json nests it --------

REAL_26B = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "eos_token_id": [1, 106],
    "tie_word_embeddings": True,
    "text_config": {key: value for key, value in known_models.REAL_TARGET.items() if key != "architectures"},
}


@pytest.fixture(scope="module")
def cfg_26b():
    cfg = parse_config(REAL_26B)
    assert [i for i, layer in enumerate(cfg.layers) if not layer.sliding] == [5, 11, 17, 23, 29]
    assert {(layer.num_kv_heads, layer.head_dim) for layer in cfg.layers if layer.sliding} == {(8, 256)}
    assert {(layer.num_kv_heads, layer.head_dim) for layer in cfg.layers if not layer.sliding} == {(2, 512)}
    return cfg


def test_kv_cache_bytes_of_gemma4_26b_by_hand(cfg_26b):
    # bf16 at 32768: 25 sliding layers keep a ring of 1024 + 16 = 1040 positions, 5 full layers all
    # 32768; each position stores K and V: 2 x kv_heads x head_dim x 2 bytes
    sliding = 25 * 1040 * 2 * 8 * 256 * 2  # 212,992,000
    full = 5 * 32768 * 2 * 2 * 512 * 2  # 671,088,640
    assert kv_cache_bytes(cfg_26b, 32768, "bfloat16") == sliding + full == 884_080_640

    # fp8 at 32768: 1 byte per element, plus an fp32 scale per (position, KV head) for K and for V
    sliding = 25 * 1040 * (2 * 8 * 256 * 1 + 2 * 8 * 4)  # 108,160,000
    full = 5 * 32768 * (2 * 2 * 512 * 1 + 2 * 2 * 4)  # 338,165,760
    assert kv_cache_bytes(cfg_26b, 32768, "fp8") == sliding + full == 446_325_760

    # fp32 at 512, below the window: every layer holds just the 512 positions
    sliding = 25 * 512 * 2 * 8 * 256 * 4  # 209,715,200
    full = 5 * 512 * 2 * 2 * 512 * 4  # 20,971,520
    assert kv_cache_bytes(cfg_26b, 512, "float32") == sliding + full == 230_686_720

    # bf16 at the model's limit, 262144 positions
    assert kv_cache_bytes(cfg_26b, 262144, "bfloat16") == 25 * 1040 * 8192 + 5 * 262144 * 4096

    # fp8 data is 100 KiB/token on the sliding layers, 10 KiB/token on the full
    # ones; the scales add 4 bytes per 256 or 512 data bytes
    per_token_full = (kv_cache_bytes(cfg_26b, 40000, "fp8") - kv_cache_bytes(cfg_26b, 30000, "fp8")) / 10000
    assert per_token_full == 10 * 1024 + 5 * 2 * 2 * 4


def test_loaded_weight_bytes_of_gemma4_26b(cfg_26b):
    """docs/model.md: 25,233,141,760 text parameters; the 30 layer_scalar values are
    buffers in transformers, not parameters. Our model keeps the 612,096 norm weights in fp32."""
    norms = 30 * 7 * 2816 + 25 * 2 * 256 + 5 * 2 * 512 + 2816  # 7 per layer, q/k norms, final norm
    assert norms == 612_096
    assert loaded_weight_bytes(cfg_26b) == 2 * (25_233_141_760 + 30) + 2 * norms


def test_workspace_allowance_of_gemma4_26b(cfg_26b):
    # plain-torch attention: the last 1024-token prefill chunk attending over 32768 keys on a full
    # layer, in passes of as many query rows as fit 256 MiB of scores: two fp32 score matrices of
    # 16 heads per row (masked in place, softmaxed) and two bool masks (4,259,840 bytes a row -> 63
    # rows), and that layer's K and V read back from fp8 in bf16 (2 KV heads x 512)
    per_row = 2 * 16 * 32768 * 4 + 32768 * 2
    rows = (256 << 20) // per_row
    assert rows == 63
    scores = rows * per_row
    readback = 2 * 32768 * 2 * 512 * 2
    assert workspace_bytes(cfg_26b, 32768, triton=False) == WORKSPACE_FIXED_BYTES + scores + readback
    # at 256K the cast of V (fp32, then bf16) beside K in bf16 is the larger peak
    elements = 262144 * 2 * 512
    assert workspace_bytes(cfg_26b, 262144, triton=False) == WORKSPACE_FIXED_BYTES + elements * (2 + 4 + 2)
    # the Triton path allocates no scores and reads a full layer's fp8 keys where they are stored:
    # only a sliding layer's window and the chunk (1023 + 1024 keys, 8 KV heads x 256) come back in
    # bf16, through an fp32 cast, whatever the context
    sliding = (1023 + 1024) * 8 * 256
    for context in (32768, 262144):
        assert workspace_bytes(cfg_26b, context, triton=True) == WORKSPACE_FIXED_BYTES + sliding * (2 + 4 + 2)
    # an fp32 cache is read back in bf16 on the Triton path too: the full layer's cast again
    assert workspace_bytes(cfg_26b, 262144, kv_dtype="float32", triton=True) == WORKSPACE_FIXED_BYTES + elements * (
        2 + 4 + 2
    )
    assert PREFILL_CHUNK == 1024


# -- flashdesk doctor --model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("doctor-pristine")
    write_checkpoint(folder, "conditional", seed=2)
    return folder


@pytest.fixture
def ckpt(pristine, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(pristine, folder)
    return folder


def doctor(capsys, *args):
    rc = main(["doctor", *args])
    captured = capsys.readouterr()
    model_part = captured.out.split("\nModel: ", 1)[1]
    assert "Traceback" not in captured.out + captured.err
    return rc, model_part


def held_bytes(model: Gemma4) -> int:
    """Every weight tensor our model keeps, by walking it (not the computed RoPE tables)."""

    def tensors(obj):
        for name, value in vars(obj).items():
            if name in ("rope_freqs", "embed_scale", "spec"):
                continue
            if isinstance(value, torch.Tensor):
                yield value
            elif isinstance(value, dict):
                yield from (v for v in value.values() if isinstance(v, torch.Tensor))

    return sum(t.numel() * t.element_size() for obj in [model, *model.layers] for t in tensors(obj))


def test_doctor_reports_a_complete_checkpoint_with_its_numbers(ckpt, capsys):
    rc, out = doctor(capsys, "--model", str(ckpt), "--context", "1000")
    assert rc == 0, out
    report = inspect_checkpoint(ckpt, 1000)
    assert report.ok and report.problems == []

    # on disk: the text tensors as stored (fp32 here), the tied lm_head and the towers left out
    stored = load_file(str(ckpt / "model.safetensors"))
    text = {n: t for n, t in stored.items() if not n.startswith(TOWER_PREFIXES) and n != "lm_head.weight"}
    towers = {n: t for n, t in stored.items() if n.startswith(TOWER_PREFIXES)}
    assert towers, "the conditional layout has a vision tower"
    assert report.tensors == len(text) == 132
    assert report.disk_bytes == sum(t.numel() * t.element_size() for t in text.values())
    assert report.tower_bytes == sum(t.numel() * t.element_size() for t in towers.values())
    # as loaded in bf16: exactly what our model holds
    assert report.loaded_bytes == held_bytes(load_target(ckpt, "cpu", torch.bfloat16))

    mem = report.memory
    assert mem.context == 1000 and mem.kv_dtype == "fp8"
    assert mem.kv_bytes == load_target(ckpt).new_cache(1000, "fp8").nbytes()
    assert mem.total == report.loaded_bytes + mem.kv_bytes + mem.workspace_bytes
    assert mem.workspace_bytes > WORKSPACE_FIXED_BYTES

    for expected in (
        "Gemma4ForConditionalGeneration, 6 layers (4 sliding, 2 full), hidden 64",
        "sliding 2 KV heads x 16, window 8; full 1 KV head x 32, K = V",
        "8, top 2, expert intermediate 24; dense MLP 96",
        f"limit {TINY_LIMIT} tokens",
        f"complete: 132 tensors in 1 file(s); {format_bytes(report.disk_bytes)} on disk (f32), "
        f"{format_bytes(report.loaded_bytes)} as bf16 on the GPU",
        f"vision/audio towers: {len(towers)} tensors",
        "tokenizer.json + tokenizer_config.json; chat template in chat_template.jinja",
        f"{format_bytes(mem.total)} at 1000 tokens",
        f"KV (fp8) {format_bytes(mem.kv_bytes)}",
        "verdict    ok",
    ):
        assert expected in out, expected
    assert "problem" not in out
    assert len(out.splitlines()) <= 14  # compact


def test_default_context_is_capped_at_the_model_limit(ckpt, capsys):
    rc, out = doctor(capsys, "--model", str(ckpt))  # the CLI's default: 32768
    assert rc == 0
    assert f"at {TINY_LIMIT} tokens (the model's limit; 32768 asked)" in out
    assert describe_checkpoint(ckpt) == describe_checkpoint(ckpt, 32768)


def test_sharded_checkpoint(tmp_path, capsys):
    write_checkpoint(tmp_path, "causal", seed=4, shard=True, tokenizer=False)
    rc, out = doctor(capsys, "--model", str(tmp_path))
    shards = len(list(tmp_path.glob("model-*.safetensors")))
    assert rc == 0 and shards > 1
    assert f"complete: 132 tensors in {shards} file(s)" in out
    assert "vision/audio towers" not in out
    # a missing tokenizer is said, but does not fail the check: --prompt-ids works without one
    assert "tokenizer  missing (no tokenizer.json)" in out


def test_missing_tensor(ckpt, capsys):
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["model.language_model.layers.3.self_attn.o_proj.weight"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    rc, out = doctor(capsys, "--model", str(ckpt))
    assert rc == 1
    assert "problem    missing tensor layers.3.self_attn.o_proj.weight" in out
    assert "NOT usable: 1 problem" in out
    assert "config     Gemma4ForConditionalGeneration" in out  # what could be read is still shown
    assert "complete" not in out


def test_missing_config(ckpt, capsys):
    (ckpt / "config.json").unlink()
    rc, out = doctor(capsys, "--model", str(ckpt))
    assert rc == 1
    assert f"problem    model config not found: {ckpt / 'config.json'}" in out
    assert "NOT usable" in out


def test_unsupported_config_is_named(ckpt, capsys):
    config = json.loads((ckpt / "config.json").read_text())
    config["text_config"]["hidden_activation"] = "silu"
    (ckpt / "config.json").write_text(json.dumps(config))
    rc, out = doctor(capsys, "--model", str(ckpt))
    assert rc == 1
    assert "activation 'silu' is not supported by FlashDesk" in out


def test_truncated_weights_file(ckpt, capsys):
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    rc, out = doctor(capsys, "--model", str(ckpt))
    assert rc == 1
    assert "problem" in out and "truncated" in out


def test_missing_shard(tmp_path, capsys):
    write_checkpoint(tmp_path, "causal", seed=4, shard=True, tokenizer=False)
    victim = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    victim.unlink()
    rc, out = doctor(capsys, "--model", str(tmp_path))
    assert rc == 1
    assert f"shard file(s) named in model.safetensors.index.json are missing: {victim.name}" in out


def test_no_chat_template(ckpt, capsys):
    (ckpt / "chat_template.jinja").unlink()
    rc, out = doctor(capsys, "--model", str(ckpt))
    assert rc == 0
    assert "no chat template" in out


def test_a_missing_folder_is_named_as_such(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["doctor", "--model", str(missing)]) == 1
    captured = capsys.readouterr()
    assert f"flashdesk doctor: model folder not found: {missing} (give a folder holding config.json" in captured.err
    assert "is not a folder" in captured.out  # the report still runs to its end
    assert captured.out.splitlines()[-1] == f"verdict: the model is NOT usable: {missing} is not a folder"


def test_a_file_given_as_the_model_folder(ckpt, capsys):
    assert main(["doctor", "--model", str(ckpt / "config.json")]) == 1
    assert f"flashdesk doctor: model path is a file, not a folder: {ckpt / 'config.json'}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1"])
@pytest.mark.parametrize("with_model", [False, True])
def test_an_impossible_context_is_refused(ckpt, capsys, value, with_model):
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--context", value] + (["--model", str(ckpt)] if with_model else []))
    assert exit_info.value.code == 2
    assert f"flashdesk doctor: error: argument --context: must be at least 1, got {value}" in capsys.readouterr().err


# -- the verdict: doctor's last line -----------------------------------------------------------


def last_line(capsys, *args) -> str:
    main(["doctor", *args])
    return capsys.readouterr().out.splitlines()[-1]


@pytest.fixture
def real_need(cfg_26b):
    """What the real pair needs at the smallest useful context: the 4-bit target, the bf16 drafter, fp8 KV."""
    drafter = parse_draft_config(draft_raw())
    weights = int4_weight_bytes(cfg_26b)
    return format_bytes(plan_memory(cfg_26b, weights, MIN_USEFUL_CONTEXT, "fp8", drafter).total)


def fake_gpu(monkeypatch, free_gib: float, total_gib: float = 24.0, name: str = "NVIDIA GeForce RTX 4090"):
    monkeypatch.setattr(doctor_tool, "_gpu0", lambda: doctor_tool.Gpu(name, int(free_gib * GIB), int(total_gib * GIB)))


def test_the_verdict_on_this_machine(capsys, monkeypatch, real_need):
    line = last_line(capsys)
    assert line.startswith("verdict: ")
    if not torch.cuda.is_available():
        assert line == (
            "verdict: CPU only: the demo and test models run; Gemma 4 26B-A4B with DFlash needs an "
            f"NVIDIA GPU with at least {real_need} free"
        )
    assert real_need == "16.22 GiB"  # README: 16.3 GiB at 8K tokens, 16.22 at the 2048 the engine needs at least


def test_the_verdict_on_a_gpu(capsys, monkeypatch, real_need):
    fake_gpu(monkeypatch, 22.0)
    assert last_line(capsys) == (
        "verdict: NVIDIA GeForce RTX 4090 (22.00 GiB free of 24.00 GiB): Gemma 4 26B-A4B "
        "with DFlash fits, context up to 262144 tokens with fp8 KV"
    )
    fake_gpu(monkeypatch, 19.0)
    longest = int(last_line(capsys).split("context up to ")[1].split()[0])
    assert 131072 < longest < 262144  # README: 17.9 GiB at 128K, 19.7 GiB at 256K
    fake_gpu(monkeypatch, 11.0, 12.0, "NVIDIA GeForce RTX 4070")
    assert last_line(capsys) == (
        "verdict: NVIDIA GeForce RTX 4070 (11.00 GiB free of 12.00 GiB): too little free "
        f"memory for Gemma 4 26B-A4B with DFlash (needs at least {real_need})"
    )


def test_the_verdict_on_a_model(ckpt, capsys, monkeypatch):
    report = inspect_checkpoint(ckpt, 1000)
    need = f"{format_bytes(report.memory.total)} at 1000 tokens"
    monkeypatch.setattr(doctor_tool, "_gpu0", lambda: None)
    assert last_line(capsys, "--model", str(ckpt), "--context", "1000") == (
        f"verdict: CPU only: the model is complete and the engine runs it on the CPU here (on a GPU it needs {need})"
    )
    fake_gpu(monkeypatch, 22.0)
    assert last_line(capsys, "--model", str(ckpt), "--context", "1000") == (
        f"verdict: the model is complete and fits: {need}, 22.00 GiB free on NVIDIA GeForce RTX 4090"
    )
    free = report.memory.total - 1
    longest = longest_context(report.config, report.loaded_bytes, "fp8", free)
    assert 0 < longest < 1000
    fake_gpu(monkeypatch, free / GIB)
    assert last_line(capsys, "--model", str(ckpt), "--context", "1000") == (
        f"verdict: the model is complete but needs {need}, {format_bytes(free)} free on NVIDIA GeForce RTX 4090; "
        f"it fits with --context {longest}"
    )
    fake_gpu(monkeypatch, 0.5)
    assert last_line(capsys, "--model", str(ckpt), "--context", "1000") == (
        "verdict: the model is complete but does not fit at any context, 512.0 MiB free on NVIDIA GeForce RTX 4090"
    )
