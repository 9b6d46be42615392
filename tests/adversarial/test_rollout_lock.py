"""Two ``rollout`` processes on one output directory: the second fails at once with one line naming the
first; the first finishes unharmed and leaves a readable index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composer_replication._lock import DirectoryInUse
from composer_replication.datagen.rollout import oracle_policy, run_rollouts
from composer_replication.datagen.tasks import bundled_tasks

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def _cli(out: Path, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "composer_replication.cli.main", "rollout", "--out", str(out)]
    argv += ["--sandbox", "bwrap", *extra]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_a_second_rollout_process_on_the_same_directory_fails_naming_the_first(tmp_path):
    out = tmp_path / "gen"
    first = _cli(out)  # every bundled task: several seconds
    deadline = time.monotonic() + 60
    while "pid" not in ((out / ".lock").read_text() if (out / ".lock").exists() else ""):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = _cli(out, "--tasks", "off_by_one")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 1, err
    assert err.count("\n") == 1 and f"pid {first.pid}" in err and "in use" in err, err
    with pytest.raises(DirectoryInUse, match=f"pid {first.pid}"):
        run_rollouts([bundled_tasks()["off_by_one"]], oracle_policy, out, progress=False)
    stdout, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(r["task"] for r in rows) == sorted(bundled_tasks())
    assert all(r["reward"] == 1.0 and r["reward_hack"] is False for r in rows)
    assert "reward_hack_attempts=0" in err
    # once the first is done, the directory is free again (a rerun resumes: nothing left to do)
    assert run_rollouts(list(bundled_tasks().values()), oracle_policy, out, progress=False) == []
