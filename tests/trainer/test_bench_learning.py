"""The learning benchmark's harness end to end on the tiny model (the real run uses SmolLM2; see
docs/benchmarks/learning.md): every variant trained and measured, the JSON shape, the run cache, and
one-line errors for bad input."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_learning.py"
SESSIONS = ROOT / "tests" / "data" / "sessions"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """Two sessions to train on, one (with three failed shell commands) held out."""
    root = tmp_path_factory.mktemp("bench-sessions")
    train, held = root / "train", root / "eval"
    train.mkdir()
    held.mkdir()
    for name in ("d-kimuson__claude-code-viewer__5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl",
                 "iansherr__claude-code-log__326189cf-5676-4237-8cde-1ce80aae4a9f.jsonl"):  # fmt: skip
        shutil.copy(SESSIONS / "claude_code" / name, train / name)
    codex = "AcidicSoil__codex-session-view__rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl"
    shutil.copy(SESSIONS / "codex" / codex, held / codex)
    return train, held


def bench(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env_cmd = [sys.executable, str(BENCH), *args]
    return subprocess.run(env_cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_every_variant_trains_and_is_measured(folders, tmp_path):
    train, held = folders
    out = tmp_path / "learning.json"
    # a random tiny model rarely ends an answer, so its greedy answers are kept short
    args = ["--train-sessions", str(train), "--eval-sessions", str(held), "--out", str(out), "--model", "tiny",
            "--seeds", "2", "--steps", "3", "--lr", "0.01", "--sandbox-tasks", "fix_import", "--grpo-steps", "1",
            "--max-new-tokens", "24"]  # fmt: skip
    r = bench(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) == {"variants", "config"}
    variants = result["variants"]
    assert list(variants) == [
        "base", "sft", "sft+sdpo_recorded", "sft+sdpo_on_policy", "sft+sdpo+dpo", "sft+sdpo+dpo+grpo",
    ]  # fmt: skip
    metrics = {"recovery_ce", "hinted_jsd", "valid_rate", "tool_match_rate", "pref_accuracy",
               "sandbox_reward", "sandbox_pass_rate"}  # fmt: skip
    for name, per_metric in variants.items():
        assert set(per_metric) == metrics, name
        for m, s in per_metric.items():
            assert set(s) == {"mean", "std", "n"} and math.isfinite(s["mean"]) and s["std"] >= 0
            assert s["n"] == (1 if name == "base" else 2), (name, m)
    cfg = result["config"]
    assert cfg["n_sites"] == 3 and cfg["seeds"] == 2 and cfg["n_train_sites"] >= 3
    # the per-site change against SFT (sites averaged over seeds), with its interval
    ce = cfg["paired_vs_sft"]["sft+sdpo_on_policy"]["recovery_ce"]
    assert ce["n"] == 3 and ce["delta_ci95"][0] <= ce["delta"] <= ce["delta_ci95"][1]
    assert ce["before"] == pytest.approx(variants["sft"]["recovery_ce"]["mean"])
    # training moved the model: at lr 0.01 three SFT steps change the held-out recovery CE
    assert variants["sft"]["recovery_ce"]["mean"] != variants["base"]["recovery_ce"]["mean"]
    # different seeds give different adapters
    assert variants["sft+sdpo_on_policy"]["recovery_ce"]["std"] > 0
    runs = [json.loads(x) for x in out.with_suffix(".runs.jsonl").read_text().splitlines()]
    assert len(runs) == 1 + 5 * 2
    on_policy = [x for x in runs if x["variant"] == "sft+sdpo_on_policy"]
    assert all(x["channels"]["loss/sdpo_jsd"] > 0 for x in on_policy)
    assert all(x["channels"]["loss/trace_replay_dpo"] > 0 for x in runs if x["variant"] == "sft+sdpo+dpo")

    # a rerun finds every run in the cache and writes the same table
    before = out.read_text()
    r2 = bench(*args)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "seed" not in r2.stdout.replace("seeds", "")  # nothing was trained or measured again
    assert json.loads(out.read_text())["variants"] == json.loads(before)["variants"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--variants", "base,sft+ppo"], "unknown variant 'sft+ppo'"),
        (["--metrics", "recovery_ce,bleu"], "unknown metric 'bleu'"),
        (["--seeds", "0"], "--seeds 0"),
    ],
)
def test_bad_names_get_one_line_errors(folders, tmp_path, extra, message):
    train, held = folders
    r = bench("--train-sessions", str(train), "--eval-sessions", str(held), "--out", str(tmp_path / "o.json"),
              "--model", "tiny", *extra, timeout=60)  # fmt: skip
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_missing_session_folder_is_named(folders, tmp_path):
    train, _ = folders
    r = bench("--train-sessions", str(train), "--eval-sessions", str(tmp_path / "nope"),
              "--out", str(tmp_path / "o.json"), timeout=60)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"bench_learning.py: error: --eval-sessions {tmp_path / 'nope'}: no such session folder"
    ]
