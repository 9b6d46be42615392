"""The real CLI, end to end, on two real sessions with the tiny model and loopback teachers."""

from __future__ import annotations

import json

from composer_replication._io import read_jsonl
from composer_replication.ingestion import read_states
from composer_replication.pipeline.manifest import Manifest

from ._chromium import chromium_available, images_loaded
from .conftest import AGREED, COST_PER_CALL, TASK_STAGES, cli, reduced_config

STAGES = [
    "ingest",
    "split",
    "replay",
    "pairs",
    "normalize",
    "mine_tasks",
    "eval_tasks_before",
    "train_offline",
    "train_grpo",
    "evaluate",
    "eval_tasks_after",
    "report",
]


def test_run_status_and_rerun(tmp_path, teacher_server):
    cfg = reduced_config(tmp_path, teacher_server.url)
    run = tmp_path / "run"
    p = cli("run", str(cfg), "--out", str(run))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"report: {run / 'report' / 'report.html'}" in p.stdout

    m = Manifest.load(run)
    assert [n for n in m.stages] == STAGES
    assert all(r.status == ("disabled" if n in TASK_STAGES else "done") for n, r in m.stages.items()), {
        n: (r.status, r.error) for n, r in m.stages.items()
    }
    assert m.data["config"]["replay"]["max_total_usd"] == 1.0 and m.data["versions"]["torch"]

    # replay: every selected state went to every teacher exactly once, and the ledger booked what was billed
    states = list(read_states(run / "replay" / "states.jsonl"))
    assert states and all(
        s["state_id"].startswith("d-kimuson") for s in states
    )  # held-out trace not replayed
    assert dict(teacher_server.calls) == {m: len(states) for m in ("agree-a", "agree-b", "dissent")}
    spent = m.stages["replay"].summary["spent_usd"]
    assert abs(spent - 3 * len(states) * COST_PER_CALL) < 1e-9

    # pairs: the two agreeing teachers beat the student wherever it did something else
    pairs = list(read_jsonl(run / "normalize" / "pairs.jsonl"))
    assert pairs and all(p["chosen_messages"][0]["content"] == AGREED for p in pairs)
    per_teacher = json.loads((run / "pairs" / "per_teacher.json").read_text())
    assert per_teacher == {"test/agree-a": len(pairs), "test/agree-b": len(pairs), "test/dissent": 0}

    # training wrote per-channel losses; both phases produced loadable models
    rows = list(read_jsonl(run / "train" / "offline" / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2] and "loss/trace_replay_dpo" in rows[0]
    assert (run / "train" / "offline" / "final" / "config.json").exists()
    assert (run / "train" / "grpo" / "final" / "config.json").exists()

    ev = json.loads((run / "eval" / "eval.json").read_text())
    assert ev["before"]["n_sites"] == ev["after"]["n_sites"] == ev["heldout_sites"] > 0
    assert ev["before"]["model"] != ev["after"]["model"]
    assert ev["after"]["sandbox_tasks"] == 1

    st = cli("status", str(run))
    assert st.returncode == 0, st.stderr
    assert "replay" in st.stdout and f"spend: ${spent:.4f} of $1.00 cap" in st.stdout
    assert "report: " + str(run / "report" / "report.html") in st.stdout

    # a second run finds everything current: no stage runs, no teacher is called again
    again = cli("run", str(cfg), "--out", str(run))
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("up to date, skipped") == len(STAGES) - len(TASK_STAGES)
    assert dict(teacher_server.calls) == {m: len(states) for m in ("agree-a", "agree-b", "dissent")}

    if chromium_available():
        loaded, total = images_loaded(run / "report" / "report.html")
        assert loaded == total >= 5

    # evaluate.max_sites 0 (the demo's): no separate greedy answers; the numbers and the report's sample
    # answers come from the comparison at every held-out error site, and only evaluate and report rerun
    zero = cli("run", str(cfg), "--out", str(run), "--set", "evaluate.max_sites=0")
    assert zero.returncode == 0, zero.stderr[-3000:]
    assert zero.stdout.count("up to date, skipped") == len(STAGES) - len(TASK_STAGES) - 2  # task stages: disabled
    ev0 = json.loads((run / "eval" / "eval.json").read_text())
    assert ev0["before"]["sites"] == [] and ev0["sites"]["metrics"] == ev["sites"]["metrics"]
    n = ev0["sites"]["n_sites"]
    assert n == m.stages["split"].summary["heldout_error_sites"] > 0
    assert len(ev0["sites"]["answers"]["before"]) == len(ev0["sites"]["answers"]["after"]) == n
    page = (run / "report" / "report.html").read_text()
    assert "held-out error site" in page.split("<h3>Sample answers</h3>")[1].split("</p>")[0]


def test_bad_config_names_the_field(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("replay:\n  max_total_usd: -1\n  teachrs: []\n")
    p = cli("run", str(cfg), "--out", str(tmp_path / "r"))
    assert p.returncode == 1
    assert "replay.max_total_usd" in p.stderr and "replay.teachrs" in p.stderr and str(cfg) in p.stderr


def test_dry_run_prices_replay_without_sending(tmp_path, teacher_server):
    cfg = reduced_config(tmp_path, teacher_server.url)
    p = cli("run", str(cfg), "--out", str(tmp_path / "run"), "--dry-run")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "replay would send 6 calls (0 already cached) for 2 states" in p.stdout
    assert "test/agree-a" in p.stdout and "cap $1.00" in p.stdout
    assert sum(teacher_server.calls.values()) == 0
    assert not (tmp_path / "run" / "replay").exists()
