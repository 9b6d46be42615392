"""`benchmarks/gpu_bench.py --tiny`: the offline-step and 2-process DDP rows run end to end on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_bench_tiny_prints_one_json_line_per_row():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu_bench.py"),
        "--tiny",
        "--repeats",
        "1",
        "--hint",
        "16",
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {r["row"]: r for r in map(json.loads, p.stdout.splitlines())}
    assert set(rows) == {"offline-sft", "offline-3ch", "offline-3ch-vs-sft", "ddp-3ch"}
    assert all(r["status"] == "ok" for r in rows.values())
    sft, three, ddp = rows["offline-sft"], rows["offline-3ch"], rows["ddp-3ch"]
    assert set(sft["tokens"]) == {"input_ids"}
    assert set(three["tokens"]) == {
        "input_ids",
        "ctx_teacher_input_ids",
        "dpo_chosen_input_ids",
        "dpo_rejected_input_ids",
    }
    assert three["tokens"]["ctx_teacher_input_ids"] == 2 * (64 + 16)  # B x (T + hint)
    for r in (sft, three):
        assert r["train_tokens_per_s"] > 0 and r["peak_gib"] > 0 and r["loss"] > 0
    assert rows["offline-3ch-vs-sft"]["time_ratio"] == pytest.approx(three["step_s"] / sft["step_s"])
    assert ddp["processes"] == 2 and len(ddp["rank_step_s"]) == 2 and 0 < ddp["scaling_efficiency"]


def test_gpu_bench_dry_run_lists_the_offline_suites():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), "--dry-run", "--model", "7b"],
                       capture_output=True, text=True, check=True)  # fmt: skip
    plan = json.loads(p.stdout)
    assert plan["suites"] == ["gjsd", "offline", "ddp"] and plan["model"] == "7b"
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), "--dry-run", "--suites", "fsdp"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "unknown suites" in bad.stderr
