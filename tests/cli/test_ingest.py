"""The ingest CLI on the bundled real sessions: outputs, stats table, idempotent reruns."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from composer_replication.ingestion import StoreFormatError, read_sessions, read_states

DATA = Path(__file__).parents[1] / "data" / "sessions"


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "composer_replication.cli.main", "ingest", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_cli_ingests_real_sessions_and_is_idempotent(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = _run(str(DATA), "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert "states written" in first.stdout and "tool errors" in first.stdout
    stats = json.loads((out / "ingest_stats.json").read_text())
    states = (out / "states.jsonl").read_bytes()
    traces = (out / "traces.jsonl").read_bytes()
    # A header line, then one reference per state / example.
    assert stats["totals"]["n_states_emitted"] == states.count(b"\n") - 1 > 0
    assert stats["totals"]["n_examples"] == traces.count(b"\n") - 1 > 0
    assert {f["format"] for f in stats["files"]} == {"claude_code", "codex"}
    rows = list(read_states(out / "states.jsonl"))
    ids = [s["state_id"] for s in rows]
    assert len(ids) == len(set(ids)) == stats["totals"]["n_states_emitted"]
    assert all(s["messages"][0]["role"] == "system" and s["student_action"] for s in rows)
    sessions = list(read_sessions(out))
    assert sum(s["n_states"] for s in sessions) == len(ids)
    again = _run(str(DATA), "--out", str(out))
    assert again.returncode == 0
    assert re.search(r"unchanged \(not read\)\s+" + str(len(stats["files"])), again.stdout), again.stdout
    assert (out / "states.jsonl").read_bytes() == states and (out / "traces.jsonl").read_bytes() == traces
    forced = _run(str(DATA), "--out", str(out), "--force")
    assert forced.returncode == 0
    assert (out / "states.jsonl").read_bytes() == states and (out / "traces.jsonl").read_bytes() == traces


def test_old_format_states_file_is_refused_with_one_line(tmp_path: Path) -> None:
    old = tmp_path / "states.jsonl"
    row = {
        "state_id": "a::0000",
        "messages": [{"role": "user", "content": "hi"}],
        "student_action": "x",
        "trace_id": "a",
        "turn_index": 0,
        "source": "claude_code",
        "tools": [],
    }  # what ingest wrote before
    old.write_text(json.dumps(row) + "\n")
    with pytest.raises(StoreFormatError, match=r"states.jsonl:1: written by an older ingest.*re-ingest"):
        list(read_states(old))
    r = subprocess.run(
        [sys.executable, "-m", "composer_replication.cli.main", "replay", str(old), "--out", str(tmp_path / "r"),
         "--max-usd", "0.01", "--dry-run"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "older ingest" in r.stderr and "composer-replication ingest" in r.stderr
    # Hand-made TraceState rows (what replay_trace takes) are still read as they are.
    own = tmp_path / "mine.jsonl"
    own.write_text(json.dumps({k: row[k] for k in ("state_id", "messages", "student_action")}) + "\n")
    assert [s["state_id"] for s in read_states(own)] == ["a::0000"]


def test_cli_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    r = _run(str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert r.returncode == 1 and "no such file or folder" in r.stderr


def test_jobs_defaults_to_one_worker_per_core_and_gives_the_same_bytes(tmp_path: Path, monkeypatch) -> None:
    import argparse
    import os

    from composer_replication.cli import _types

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(3)), raising=False)
    assert _types.jobs("auto") == _types.auto_jobs() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert _types.jobs("auto") == _types.MAX_AUTO_JOBS and _types.jobs("2") == 2
    for bad in ("0", "-1", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            _types.jobs(bad)
    # the CLI default forks workers over the two project folders: the same outputs as one process
    outs = {}
    for flag in ("1", None):
        out = tmp_path / f"out{flag}"
        res = _run(str(DATA), "--out", str(out), *(("--jobs", flag) if flag else ()))
        assert res.returncode == 0, res.stderr
        outs[flag] = [
            (out / n).read_bytes().replace(str(out).encode(), b"OUT")
            for n in ("states.jsonl", "traces.jsonl", "sessions.jsonl")
        ]
    assert outs["1"] == outs[None]
    bad = _run(str(DATA), "--out", str(tmp_path / "x"), "--jobs", "0")
    assert bad.returncode == 2 and "--jobs" in bad.stderr and "must be >= 1" in bad.stderr
