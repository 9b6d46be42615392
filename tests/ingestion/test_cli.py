"""The ingest CLI on the bundled real sessions: outputs, stats table, idempotent reruns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    assert stats["totals"]["n_states_emitted"] == states.count(b"\n") > 0
    assert stats["totals"]["n_examples"] == traces.count(b"\n") > 0
    assert {f["format"] for f in stats["files"]} == {"claude_code", "codex"}
    ids = [json.loads(x)["state_id"] for x in states.splitlines()]
    assert len(ids) == len(set(ids))
    again = _run(str(DATA), "--out", str(out))
    assert again.returncode == 0 and "inputs unchanged" in again.stdout
    forced = _run(str(DATA), "--out", str(out), "--force")
    assert forced.returncode == 0
    assert (out / "states.jsonl").read_bytes() == states and (out / "traces.jsonl").read_bytes() == traces


def test_cli_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    r = _run(str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert r.returncode == 1 and "no such file or folder" in r.stderr
