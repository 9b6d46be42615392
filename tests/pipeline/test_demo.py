"""`composer-replication demo --fast`: the bundled sessions, in-process teachers, every stage, offline."""

from __future__ import annotations

import json

import pytest

from composer_replication._io import read_jsonl
from composer_replication.datagen.tasks import bundled_tasks
from composer_replication.pipeline.manifest import Manifest

from ._chromium import chromium_available, images_loaded
from .conftest import TASK_STAGES, cli


@pytest.mark.slow
def test_fast_demo_runs_every_stage_offline(tmp_path):
    out = tmp_path / "demo"
    p = cli("demo", "--fast", "--out", str(out), env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"report: {out / 'report' / 'report.html'}" in p.stdout
    m = Manifest.load(out)
    assert all(r.status == ("disabled" if n in TASK_STAGES else "done") for n, r in m.stages.items()), {
        n: (r.status, r.error) for n, r in m.stages.items()
    }
    # the 6 sessions of learning_sessions/eval: the 30 sites the README names, and the ones evaluate compares
    assert m.stages["split"].summary["heldout_error_sites"] == 30
    assert m.stages["evaluate"].summary["heldout_error_sites"] == 30
    assert m.stages["replay"].summary["calls"] == 12 and m.stages["replay"].summary["spent_usd"] == 0.0
    # the preference channel has pairs in both phases: the training sessions' recoveries (pairs.recovery)
    n_pairs = m.stages["pairs"].summary["recovery_pairs"]
    assert n_pairs > 0 and m.stages["normalize"].summary["pairs_out"] > 0
    rows = list(read_jsonl(out / "train" / "offline" / "metrics.jsonl"))
    assert all(r["loss/trace_replay_dpo"] > 0 for r in rows)
    assert m.stages["train_grpo"].summary["pairs"] == m.stages["normalize"].summary["pairs_out"]
    # the online step trains at its own rate (a warm-up inherited from the offline phase made it lr 0)
    lrs = [
        r["learning_rate"]
        for r in read_jsonl(out / "train" / "grpo" / "metrics.jsonl")
        if "learning_rate" in r
    ]
    assert lrs and min(lrs) > 0
    ev = json.loads((out / "eval" / "eval.json").read_text())
    # the fast demo names no grpo.tasks: every bundled task is rolled out
    assert ev["after"]["sandbox_tasks"] == len(bundled_tasks()) and ev["before"]["n_sites"] == 3
    # the report: one evaluation (n=30 sites, the tasks), the recovery pairs counted, no $0 spend line
    page = (out / "report" / "report.html").read_text()
    assert "<td>valid_rate</td>" in page and "<td>30 sites</td>" in page
    assert f"<td>{len(bundled_tasks())} tasks</td>" in page
    assert f"{n_pairs} recorded recoveries from the training sessions" in page
    assert "No paid teachers in this run" in page and not (out / "report" / "spend.png").exists()
    if chromium_available():
        loaded, total = images_loaded(out / "report" / "report.html")
        assert loaded == total >= 5
