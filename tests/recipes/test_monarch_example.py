"""The Monarch example spawns a local mesh and runs one pipeline step end to end (rollout -> replay -> train)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("monarch.actor", reason="needs the monarch extra")
pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
    pytest.mark.slow,  # ~30 s unloaded: 3 processes import torch and transformers
]


def test_monarch_example_runs_one_pipeline_step(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_replication.recipes.monarch.example",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=500,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert [(r["status"], r["reward"]) for r in summary["rollouts"]] == [("ok", 1.0), ("ok", 1.0)]
    assert len(set(summary["pids"]["rollout"])) == 2 and os.getpid() not in summary["pids"]["rollout"]
    assert summary["states"] >= 4 and summary["teacher_calls"] == summary["states"]
    assert summary["train"]["examples"] == summary["states"] and math.isfinite(summary["train"]["loss"])

    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint")
    changed = [
        n for (n, a), (_, b) in zip(before.named_parameters(), after.named_parameters()) if not a.equal(b)
    ]
    assert changed, "the training step did not update the checkpoint"
    calls = [
        json.loads(x)
        for x in (tmp_path / "run" / "sessions" / "off_by_one-r0.jsonl").read_text().splitlines()
    ]
    assert calls[0]["type"] == "user" and any(c["type"] == "assistant" for c in calls)


def test_monarch_example_stops_with_exit_code_3(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "STOP").touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_replication.recipes.monarch.example",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=500,
        env=env,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "stopped: stop file" in proc.stderr
