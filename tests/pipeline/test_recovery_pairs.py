"""``pairs.recovery``: teacher-free recovery pairs join the teachers' pairs, from training traces only."""

from __future__ import annotations

import json

from composer_replication._io import read_jsonl
from composer_replication.ingestion.store import read_rows
from composer_replication.pipeline.manifest import Manifest
from composer_replication.trainer.data import recovery_pairs

from .conftest import cli, reduced_config

HELD = "iansherr__claude-code-log__326189cf-5676-4237-8cde-1ce80aae4a9f"


def _run(tmp_path, url, name, recovery):
    cfg = reduced_config(tmp_path, url, pairs={"recovery": recovery})
    cfg = cfg.rename(tmp_path / f"{name}.yaml")
    run = tmp_path / name
    p = cli("run", str(cfg), "--out", str(run), "--until", "pairs")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return run, list(read_jsonl(run / "pairs" / "raw_pairs.jsonl"))


def test_recovery_pairs_join_teacher_pairs_from_training_traces_only(tmp_path, teacher_server):
    plain_run, plain = _run(tmp_path, teacher_server.url, "plain", "none")
    run, both = _run(tmp_path, teacher_server.url, "both", "both")

    traces = list(read_rows(run / "ingest" / "traces.jsonl"))
    train = [t for t in traces if t["trace_id"] != HELD]
    held = [t for t in traces if t["trace_id"] == HELD]
    # the held-out session has recoveries of its own, so a leak would show
    assert held and recovery_pairs(held)
    want = recovery_pairs(train, at="failure") + recovery_pairs(train, at="recovery")
    assert want

    teacher = [p for p in both if p["n_teachers_agreeing"] > 0]
    mined = [p for p in both if p["n_teachers_agreeing"] == 0]
    assert teacher == plain and plain  # the teachers' pairs are untouched
    assert mined == json.loads(json.dumps(want))
    assert all(not p["state_id"].startswith(HELD) for p in mined)

    summary = Manifest.load(run).stages["pairs"].summary
    assert summary["recovery_pairs"] == len(want) and summary["pairs"] == len(plain)
    assert "recovery_pairs" not in Manifest.load(plain_run).stages["pairs"].summary


def test_recovery_setting_is_checked(tmp_path, teacher_server):
    cfg = reduced_config(tmp_path, teacher_server.url, pairs={"recovery": "always"})
    p = cli("run", str(cfg), "--out", str(tmp_path / "run"), "--until", "pairs")
    assert p.returncode != 0 and "pairs.recovery" in p.stderr
