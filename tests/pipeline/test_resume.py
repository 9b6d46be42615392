"""Interrupted runs: killed inside a stage (no cleanup, like SIGKILL), rerun, same outputs, nothing paid twice."""

from __future__ import annotations

import json

import pytest

from composer_replication._io import hash_path, read_jsonl
from composer_replication.ingestion import read_states
from composer_replication.pipeline.manifest import Manifest
from composer_replication.pipeline.runner import CRASH_ENV, CRASH_EXIT_CODE

from .conftest import COST_PER_CALL, TASK_STAGES, cli, reduced_config

TEACHERS = ("agree-a", "agree-b", "dissent")


def _ledger(run):
    rows = list(read_jsonl(run / "replay" / "ledger.jsonl"))
    return [r for r in rows if r["event"] == "settle"], [r for r in rows if r["event"] == "reserve"]


def _answers(run):
    return [
        {k: v for k, v in r.items() if k != "latency_s"}
        for r in read_jsonl(run / "replay" / "teacher_calls.jsonl")
    ]


def test_replay_killed_mid_stage_resumes_without_paying_twice(tmp_path, teacher_server):
    cfg = reduced_config(tmp_path, teacher_server.url)
    run = tmp_path / "run"
    # killed at the stage's 4th poll of the stop callback: three calls sent, answered and cached
    p = cli("run", str(cfg), "--out", str(run), "--until", "pairs", env={CRASH_ENV: "replay:4"})
    assert p.returncode == CRASH_EXIT_CODE, p.stderr[-3000:]
    assert sum(teacher_server.calls.values()) == 3
    assert Manifest.load(run).stages["replay"].status == "running"
    assert not (run / "replay" / "teacher_calls.jsonl").exists()

    p = cli("run", str(cfg), "--out", str(run), "--until", "pairs")
    assert p.returncode == 0, p.stderr[-3000:]
    n_states = len(list(read_states(run / "replay" / "states.jsonl")))
    assert dict(teacher_server.calls) == dict.fromkeys(TEACHERS, n_states)  # each call sent exactly once
    rec = Manifest.load(run).stages["replay"]
    assert rec.status == "done" and rec.attempts == 2
    assert rec.summary["cached"] == 3 and rec.summary["sent"] == 3 * n_states - 3
    settles, reserves = _ledger(run)
    assert len(settles) == len(reserves) == 3 * n_states
    assert abs(sum(r["usd"] for r in settles) - 3 * n_states * COST_PER_CALL) < 1e-9
    assert abs(rec.summary["spent_usd"] - 3 * n_states * COST_PER_CALL) < 1e-9


# where each stage is killed: N = at its N-th poll of the stop callback (mid-stage), 0 = after its body
# returned but before the manifest recorded it (its outputs are written but not trusted)
CRASH_POINTS = {
    "ingest": 0, "split": 0, "replay": 5, "pairs": 0, "normalize": 0,
    "train_offline": 3, "train_grpo": 1, "evaluate": 2, "report": 0,
}  # fmt: skip
SAME = ["ingest/states.jsonl", "ingest/traces.jsonl", "split/train_states.jsonl", "split/heldout_states.jsonl",
        "replay/states.jsonl", "pairs/raw_pairs.jsonl", "pairs/per_teacher.json",
        "normalize/pairs.jsonl", "train/offline/final/model.safetensors"]  # fmt: skip


@pytest.mark.slow
def test_killed_in_every_stage_then_rerun_matches_an_uninterrupted_run(tmp_path, teacher_server):
    ref_dir, run = tmp_path / "ref", tmp_path / "crashy"
    cfg = reduced_config(tmp_path, teacher_server.url)
    p = cli("run", str(cfg), "--out", str(ref_dir))
    assert p.returncode == 0, p.stderr[-3000:]
    ref_calls = dict(teacher_server.calls)
    teacher_server.calls.clear()

    for stage, point in CRASH_POINTS.items():
        p = cli("run", str(cfg), "--out", str(run), env={CRASH_ENV: f"{stage}:{point}" if point else stage})
        assert p.returncode == CRASH_EXIT_CODE, (stage, p.stdout[-2000:], p.stderr[-3000:])
        assert Manifest.load(run).stages[stage].status == "running", stage
    p = cli("run", str(cfg), "--out", str(run))
    assert p.returncode == 0, p.stderr[-3000:]

    m = Manifest.load(run)
    ran = {n: r for n, r in m.stages.items() if n not in TASK_STAGES}
    assert all(r.status == "done" for r in ran.values())
    assert all(m.stages[n].status == "disabled" for n in TASK_STAGES)
    assert all(r.attempts == 2 for r in ran.values()), {n: r.attempts for n, r in ran.items()}
    assert dict(teacher_server.calls) == ref_calls  # no call sent twice
    assert _ledger(run)[0] and len(_ledger(run)[0]) == len(_ledger(ref_dir)[0])
    for rel in SAME:
        assert hash_path(run / rel) == hash_path(ref_dir / rel), rel
    assert _answers(run) == _answers(ref_dir)  # same teacher answers, in the same order (latencies differ)
    ref_eval = json.loads((ref_dir / "eval" / "eval.json").read_text())
    ev = json.loads((run / "eval" / "eval.json").read_text())
    assert [s["output"] for s in ev["before"]["sites"]] == [s["output"] for s in ref_eval["before"]["sites"]]
    assert (run / "report" / "report.html").exists()
