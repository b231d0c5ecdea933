"""Measuring AR against DFlash on the user's own card: prompt sets by task type, the interleaved
runs, results kept per (device, driver, model, drafter), the chart and the text report.

`flashdesk bench` (engine/cli/bench.py) and the worker's Bench request (the app's Benchmark page)
both run `measure.run_suite`; `results.best_draft_length` turns the kept runs into the engine's
default draft length on this card.

`bench --synthetic` (engine/cli/bench_synthetic.py) needs no checkpoint: `synthetic_model` builds
the real pair's shapes with random weights and `step_bytes` counts what each step must read.
"""
