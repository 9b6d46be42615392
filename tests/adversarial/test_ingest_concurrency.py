"""Two ingests into one ``--out`` (issue 33 bug 1): one process per output folder, the second told who holds it.

Real processes on real files: the first ``ingest`` is frozen (SIGSTOP) while it holds the folder's lock, a
second one with other inputs must fail at once with one line naming the holder's pid and host, and write
nothing; the first, resumed, leaves a store that reads back as a fresh ingest of its own inputs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from composer_replication._lock import lock_holder
from composer_replication.ingestion import ingest_paths, read_examples, read_states

DATA = Path(__file__).parents[1] / "data" / "sessions"
SRC = str(Path(__file__).parents[2] / "src")


def _cmd(inp: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "composer_replication.cli.main", "ingest", str(inp), "--out", str(out),
            "--no-progress", "--jobs", "1"]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _copies(root: Path, n: int, fmt: str) -> Path:
    for k in range(n):
        shutil.copytree(DATA / fmt, root / f"-home-u-p{k:02d}")
    return root


def _freeze_while_locked(inp: Path, out: Path) -> subprocess.Popen:
    """Start an ingest and stop it (SIGSTOP) as soon as it holds ``out``'s lock."""
    for copies in (8, 32):  # more input, a longer hold, if this machine was too quick to catch it
        shutil.rmtree(out, ignore_errors=True)
        src = _copies(inp / f"x{copies}", copies, "claude_code")
        p = subprocess.Popen(
            _cmd(src, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        )
        deadline = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < deadline:
            if lock_holder(out) is not None:
                p.send_signal(signal.SIGSTOP)
                if lock_holder(out) is not None:  # still inside: frozen with the lock held
                    return p
                p.send_signal(signal.SIGCONT)
            time.sleep(0.001)
        p.communicate(timeout=60)
    raise AssertionError("the first ingest was never seen holding the lock")


def test_second_ingest_into_the_same_out_fails_naming_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = _freeze_while_locked(tmp_path / "a", out)
    try:
        before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
        other = _copies(tmp_path / "b", 1, "codex")
        t0 = time.monotonic()
        second = subprocess.run(_cmd(other, out), capture_output=True, text=True, timeout=60, env=_env())
        assert second.returncode == 1 and time.monotonic() - t0 < 30, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"in use by pid {first.pid} on {socket.gethostname()}" in lines[0], lines[0]
        assert "ingest output folder" in lines[0] and str(out) in lines[0]
        # The second wrote nothing: every file there is the first one's (and untouched while it is frozen).
        assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    finally:
        first.send_signal(signal.SIGCONT)
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-2000:]
    assert lock_holder(out) is None  # released on exit
    # The store reads back, and is exactly a fresh ingest of the first's inputs.
    src = next((tmp_path / "a").iterdir())
    fresh = tmp_path / "fresh"
    ingest_paths([src], fresh, force=True)
    for name in ("states.jsonl", "traces.jsonl", "sessions.jsonl"):
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name
    assert len(list(read_states(out / "states.jsonl"))) > 0 and list(read_examples(out / "traces.jsonl"))


def test_ingests_one_after_the_other_into_one_out_both_succeed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for fmt in ("claude_code", "codex"):
        r = subprocess.run(_cmd(_copies(tmp_path / fmt, 1, fmt), out), capture_output=True, text=True,
                           timeout=120, env=_env())  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
    rows = list(read_states(out / "states.jsonl"))  # the last run's inputs only, readable
    assert rows and all(r["messages"] for r in rows[:5])
    assert lock_holder(out) is None
