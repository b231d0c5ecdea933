"""`flashdesk bench`: every mode on the same prompts in one run, and --compare against the references."""

import json

from flashdesk.engine.tools.cli import main


def test_bench_compares_modes_and_references(spec_pair, tmp_path, capsys):
    target_dir, draft_dir = spec_pair[1]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"category": "code", "prompt": "Write hello world"}\nTell me a joke\n')
    args = ["bench", "--model", str(target_dir), "--draft", str(draft_dir), "--prompts", str(prompts),
            "--max-new-tokens", "12", "--draft-lengths", "2,5", "--compare"]
    assert main(args + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [m["mode"] for m in report["modes"]] == ["AR", "DFlash K=2", "DFlash K=5"]
    assert report["categories"] == ["code", "other"]
    assert report["outputs_identical"] is True
    ar = report["modes"][0]
    assert ar["speedup_over_ar"] == 1.0 and ar["acceptance_rate"] is None
    for mode in report["modes"][1:]:
        assert mode["speedup_over_ar"] > 0 and 0 <= mode["acceptance_rate"] <= 1
        assert mode["mean_acceptance_length"] >= 1
    assert set(report["compare"]) == {"transformers_ar", "zlab_dflash_k2", "zlab_dflash_k5"}
    assert all(c["tokens_per_second"] > 0 and c["ours_over_it"] > 0 for c in report["compare"].values())

    assert main(args) == 0
    table = capsys.readouterr().out
    assert "transformers generate (AR)" in table and "z-lab dflash_generate K=5" in table
    assert table.count("ours / it =") == 3 and "outputs identical across modes: yes" in table


def test_bench_refuses_bad_input(spec_pair, tmp_path, capsys):
    target_dir, draft_dir = spec_pair[1]
    base = ["bench", "--model", str(target_dir), "--draft", str(draft_dir)]
    assert main(base + ["--draft-lengths", "0,4"]) == 2
    assert "--draft-lengths: 0 is outside 1..15" in capsys.readouterr().err
    assert main(base + ["--prompts", str(tmp_path / "missing.jsonl")]) == 2
    assert "prompts file not found" in capsys.readouterr().err
