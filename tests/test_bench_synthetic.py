"""`flashdesk bench --synthetic`: the step set, the JSON schema, and the byte counting behind the floors."""

import json
from types import SimpleNamespace

import pytest
import torch

from flashdesk.engine.bench import step_bytes as sb
from flashdesk.engine.bench.synthetic_model import synthetic_pair
from flashdesk.engine.model import known_models as sm
from flashdesk.engine.model.config import parse_config, parse_draft_config
from flashdesk.engine.cli.main import main
from flashdesk.kernels.int4 import Int4Weight

# The real configs, shrunk so the CPU runs the whole CLI in seconds (the real shapes are checked
# by byte counting on the meta device below, where nothing is allocated).
SMALL_TARGET = dict(
    sm.REAL_TARGET,
    vocab_size=2048,
    hidden_size=128,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    global_head_dim=64,
    num_global_key_value_heads=1,
    sliding_window=16,
    num_experts=16,
    top_k_experts=4,
    moe_intermediate_size=64,
)
SMALL_DRAFTER = dict(
    sm.REAL_DRAFTER,
    hidden_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=192,
    sliding_window=24,
    vocab_size=2048,
)
NAMES = ["prefill-1024", "prefill-8192", "ar"] + [f"verify-{m}" for m in range(1, 17)] + ["draft"]


def run_cli(capsys, *flags):
    with sm.shapes(SMALL_TARGET, SMALL_DRAFTER):
        assert main(["bench", "--synthetic", "--device", "cpu", "--json", *flags]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1]), "\n".join(out[:-1])


def test_synthetic_bench_cli_schema(capsys):
    report, table = run_cli(capsys, "--layers", "6", "--context", "40", "--prefill-lengths", "16,32")
    assert {"device", "layers", "context", "kernels", "bandwidth_gbps", "steps", "ratios"} <= set(report)
    assert report["device"] == "cpu" and report["layers"] == 6 and report["context"] == 40
    assert report["kernels"] == "torch" and report["bandwidth_gbps"] is None
    steps = {step["name"]: step for step in report["steps"]}
    assert [step["name"] for step in report["steps"]] == NAMES + ["draft-int4"]
    for step in report["steps"]:
        assert step["seconds"] > 0 and step["bytes"] > 0 and step["floor_seconds"] is None, step
        assert step["bytes"] == sum(step["bytes_by_kind"].values())
    assert steps["prefill-1024"]["tokens"] == 16 and steps["prefill-8192"]["tokens"] == 32
    # a block hits at least the experts one token does; one token hits exactly top-k per layer
    assert steps["verify-1"]["experts_per_layer"] == SMALL_TARGET["top_k_experts"]
    assert steps["verify-16"]["bytes_by_kind"]["experts"] >= steps["verify-1"]["bytes_by_kind"]["experts"]
    assert steps["verify-16"]["experts_per_layer"] <= SMALL_TARGET["num_experts"]
    assert steps["ar"]["bytes"] == steps["verify-1"]["bytes"]  # same bytes, only the logits rows differ
    assert steps["draft"]["experts_per_layer"] is None and steps["draft"]["bytes_by_kind"]["kv"] > 0
    ratios = report["ratios"]
    assert ratios["verify16_over_ar"] > 0 and ratios["draft_over_ar"] > 0 and ratios["ar_floor_fraction"] is None
    assert report["targets"] is None  # met / not met only means something on a GPU
    assert "verify-16" in table and "MB read" in table and "target" not in table

    longer, _ = run_cli(capsys, "--layers", "6", "--context", "80", "--prefill-lengths", "16,96")
    skipped = {step["name"]: step for step in longer["steps"]}["prefill-8192"]
    assert skipped["seconds"] is None and "skipped" in skipped["note"]
    kv = lambda rep, name: {s["name"]: s for s in rep["steps"]}[name]["bytes_by_kind"]["kv"]  # noqa: E731
    for name in ("ar", "verify-16", "draft"):
        assert kv(longer, name) > kv(report, name), name


def test_bench_without_synthetic_still_needs_model_and_draft(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--draft", "x"])
    assert exit_info.value.code == 2
    assert "--model, --draft" in capsys.readouterr().err
    assert main(["bench", "--synthetic", "--prefill-lengths", "8", "--device", "cpu"]) == 2
    assert "--prefill-lengths" in capsys.readouterr().err


def test_kv_and_draft_kv_bytes_by_hand():
    cfg = parse_config(
        dict(SMALL_TARGET, num_hidden_layers=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    )
    # block of 2 at positions 10, 11. Sliding layer (2 KV heads x 32): keys 7..11 (the first query's
    # window of 4 and the block) = 5 positions; full layer (1 KV head x 64): keys 0..11 = 12.
    # fp8: 1 byte per element, K and V, + one 4-byte scale per (position, head) for K and for V.
    assert sb.kv_read_bytes(cfg, "fp8", 10, 2) == 5 * 2 * (2 * 32 + 2 * 4) + 12 * 1 * (2 * 64 + 2 * 4)
    assert sb.kv_read_bytes(cfg, "bfloat16", 10, 2) == 5 * 2 * 32 * 2 * 2 + 12 * 1 * 64 * 2 * 2
    assert sb.kv_read_bytes(cfg, "float32", 0, 3) == 3 * 2 * 32 * 2 * 4 + 3 * 1 * 64 * 2 * 4  # no window cut
    dcfg = parse_draft_config(
        dict(SMALL_DRAFTER, num_hidden_layers=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    )
    # sliding: the last window - 1 = 7 positions; full: all 20; 2 KV heads x 32, K and V, bf16
    assert sb.draft_kv_bytes(dcfg, 20, 2) == (7 + 20) * 2 * 32 * 2 * 2
    assert sb.draft_kv_bytes(dcfg, 5, 2) == (5 + 5) * 2 * 32 * 2 * 2


def _int4(*shape):
    meta = torch.device("meta")
    return Int4Weight(
        torch.empty(*shape[:-1], shape[-1] // 8, dtype=torch.int32, device=meta),
        torch.empty(*shape[:-1], shape[-1] // 32, dtype=torch.bfloat16, device=meta),
        None,
        32,
    )


def test_target_step_bytes_by_hand():
    cfg = parse_config(dict(SMALL_TARGET, num_hidden_layers=1, sliding_window=4, layer_types=["full_attention"]))
    layer = SimpleNamespace(
        spec=cfg.layers[0],
        q_size=64,  # not weights: ignored
        qkv=_int4(96, 64),  # 96 * 64 / 2 packed + 96 * 2 groups * 2 bytes of scale = 3072 + 384
        o_proj=(_int4(64, 32), torch.empty(64, 32, dtype=torch.bfloat16)),  # a tuple: 1024 + 128 and 4096
        norms={"a": torch.empty(64, dtype=torch.float32), "b": torch.empty(32, dtype=torch.float32)},  # 256 + 128
        layer_scalar=torch.empty(1, dtype=torch.bfloat16),  # 2
        experts_gate_up=_int4(4, 16, 64),  # per expert 16 * 64 / 2 + 16 * 2 * 2 = 576
        experts_down=_int4(4, 64, 32),  # per expert 64 * 32 / 2 + 64 * 1 * 2 = 1152
    )
    model = SimpleNamespace(
        cfg=cfg,
        layers=[layer],
        final_norm=torch.empty(64, dtype=torch.float32),
        embed=torch.empty(100, 64, dtype=torch.bfloat16),
    )
    assert sb.expert_bytes(layer) == 576 + 1152
    assert sb.layer_dense_bytes(layer) == 3072 + 384 + 1024 + 128 + 4096 + 256 + 128 + 2
    b = sb.target_step_bytes(model, "bfloat16", 3, 2, unique_ids=2, experts_hit={0: 3})
    assert b.weights == sb.layer_dense_bytes(layer) + 64 * 4 + 2 * 64 * 2  # + final norm + 2 embedding rows
    assert b.head == 100 * 64 * 2
    assert b.experts == 3 * (576 + 1152) and b.experts_per_layer == 3
    assert b.kv == 5 * 1 * 64 * 2 * 2  # full layer: keys 0..4, one KV head of 64 (SMALL's global), K and V
    assert b.total == b.weights + b.head + b.experts + b.kv
    assert sb.target_step_bytes(model, "bfloat16", 3, 2, 2, None).experts == 0  # routing not observed


def test_full_size_bytes_match_the_performance_model():
    """The real 30-layer model on the meta device (nothing allocated): docs/performance-model.md, scenario
    B32 (int4 g32 linears, bf16 head): attention 0.624 + dense MLP 0.301 + experts 0.803 + router 0.022
    + head 1.476 GB per AR token; 2.3 fp8 KV at 4K about 0.14 GB; 3.3 drafter step about 2.3 GB."""
    model, drafter = synthetic_pair(30, "meta", torch.bfloat16)
    assert [i for i, spec in enumerate(model.cfg.layers) if not spec.sliding] == [5, 11, 17, 23, 29]
    assert drafter.cfg.target_layer_ids == (1, 6, 11, 17, 22, 27)
    ar = sb.target_step_bytes(model, "fp8", 4096, 1, 1, {i: 8 for i in range(30)})
    assert ar.head == 262144 * 2816 * 2
    assert ar.experts == pytest.approx(0.803e9, rel=0.005)
    assert ar.weights == pytest.approx((0.624 + 0.301 + 0.022) * 1e9, rel=0.01)
    assert ar.kv == pytest.approx(0.14e9, rel=0.1)
    draft = sb.draft_step_bytes(drafter, 4096)
    assert draft.head == ar.head and draft.total == pytest.approx(2.3e9, rel=0.03)


def test_layer_selection_keeps_a_full_layer_and_remaps_taps():
    assert sm.remap_layer_ids([1, 6, 11, 17, 22, 27], 30) == [1, 6, 11, 17, 22, 27]
    assert sm.remap_layer_ids([1, 6, 11, 17, 22, 27], 2) == [0, 0, 0, 1, 1, 1]
    assert sm.remap_layer_ids([1, 6, 11, 17, 22, 27], 1) == [0] * 6
    for layers in (1, 2, 7):
        cfg = parse_config(sm.target_raw(layers))
        assert cfg.num_layers == layers and not cfg.layers[-1].sliding
        assert all(0 <= i < layers for i in parse_draft_config(sm.draft_raw(layers)).target_layer_ids)
    with pytest.raises(ValueError):
        sm.target_raw(31)


def test_two_full_size_layers_run_on_the_cpu(capsys):
    """The real Gemma 4 26B-A4B and drafter shapes (hidden 2816, 128 experts, the 262,144-row head),
    two layers, a short context: every step runs and reads what the byte model says."""
    assert (
        main(
            [
                "bench",
                "--synthetic",
                "--layers",
                "2",
                "--device",
                "cpu",
                "--context",
                "16",
                "--prefill-lengths",
                "16,16",
                "--repeats",
                "1",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    steps = {step["name"]: step for step in report["steps"]}
    assert set(NAMES) <= set(steps) and report["layers"] == 2
    head = 262144 * 2816 * 4  # fp32 on the CPU
    assert steps["ar"]["bytes_by_kind"]["head"] == head
    assert steps["verify-16"]["experts_per_layer"] >= steps["verify-1"]["experts_per_layer"] == 8
    assert all(step["seconds"] > 0 for step in report["steps"])


class _RecordingGraphs:
    """A stand-in for cuda_graphs.StepGraphs (which needs a GPU) that runs what a replay would run,
    eagerly, and counts the replays; `fail` makes every capture fail as a real one can."""

    made: list = []

    def __init__(self, model, cache, taps, drafter=None, ctx=None, fail=False):
        self.model, self.cache, self.taps, self.drafter, self.ctx = model, cache, taps, drafter, ctx
        self.error = "RuntimeError: capture refused" if fail else None
        self.replays, self.draft_replays = [], []
        self.made.append(self)

    def covers(self, rows):
        return self.error is None and rows <= 16

    def covers_draft(self, ctx, k):
        return self.error is None and ctx is self.ctx

    def run(self, ids):
        self.replays.append(ids.shape[0])
        return self.model.compute(ids, self.cache, self.taps, "all")

    def run_draft(self, anchor, k):
        self.draft_replays.append(k)
        return self.drafter.draft_logits(self.ctx, anchor, k)


@pytest.mark.parametrize("fail", [False, True])
def test_on_a_gpu_the_steps_timed_are_graph_replays(capsys, monkeypatch, fail):
    """Timed eagerly, an AR step on a GPU would measure Python launching ~400 kernels, not the step
    the engine replays from its CUDA graph: the bench times (and with --profile, profiles) the
    replays, and says when capture failed and the steps ran eagerly."""
    from flashdesk.engine.cli import bench_synthetic as bs

    from flashdesk.engine.bench.kernel_profile import summarize

    _RecordingGraphs.made = []
    monkeypatch.setattr(bs, "graphs_wanted", lambda device: (True, "on"))
    monkeypatch.setattr(bs, "StepGraphs", lambda *args: _RecordingGraphs(*args, fail=fail))
    monkeypatch.setattr(bs, "profile_step", lambda device, fn: fn() is None or summarize([("gemv", 0.0, 3.0)]))
    report, table = run_cli(
        capsys, "--layers", "6", "--context", "24", "--prefill-lengths", "8,16", "--repeats", "2", "--profile"
    )
    target_graphs, int4_graphs = _RecordingGraphs.made
    assert target_graphs.drafter is not int4_graphs.drafter and int4_graphs.ctx is not target_graphs.ctx
    if fail:
        assert report["cuda_graphs"] == "capture failed, steps run eagerly (RuntimeError: capture refused)"
        assert target_graphs.replays == target_graphs.draft_replays == int4_graphs.draft_replays == []
    else:
        assert report["cuda_graphs"] == "on" and "CUDA graphs: on" in table
        # ar, then verify-m, each timed twice, ar and verify-16 once more for their kernel profiles
        assert target_graphs.replays == [1, 1, 1] + [m for m in range(1, 17) for _ in range(2)] + [16]
        assert target_graphs.draft_replays == int4_graphs.draft_replays == [15, 15, 15]
    assert all(step["seconds"] > 0 for step in report["steps"])
    profiled = [step["name"] for step in report["steps"] if "kernel_profile" in step]
    assert profiled == ["ar", "verify-16", "draft", "draft-int4"]
    assert "verify-16: 1 kernels, busy 0.003 of 0.003 ms (idle 0%); gemv x1 100%" in table


def test_a_kernel_profile_counts_kernels_busy_time_and_the_gaps():
    from flashdesk.engine.bench.kernel_profile import describe, profile_step, summarize

    # (name, start us, end us): a gap of 2 us, an overlap of 1 us, a gap of 4 us
    kernels = [("gemv", 0.0, 10.0), ("norm", 12.0, 15.0), ("gemv", 14.0, 20.0), ("attn", 24.0, 30.0)]
    profile = summarize(kernels, top=2)
    assert profile["kernels"] == 4
    assert profile["span_seconds"] == pytest.approx(30e-6) and profile["busy_seconds"] == pytest.approx(24e-6)
    assert profile["idle_fraction"] == pytest.approx(0.2)
    assert [(row["name"], row["calls"]) for row in profile["top"]] == [("gemv", 2), ("attn", 1)]
    assert profile["top"][0]["share"] == pytest.approx(16 / 25)
    assert describe(profile).startswith("4 kernels, busy 0.024 of 0.030 ms (idle 20%); gemv x2 64%")
    assert summarize([])["kernels"] == 0 and describe(summarize([])) == "no kernels recorded"
    assert describe({"error": "RuntimeError: CUPTI"}) == "kernel profile failed: RuntimeError: CUPTI"
    assert profile_step(torch.device("cpu"), lambda: None) is None  # the CPU's ops are not kernels
