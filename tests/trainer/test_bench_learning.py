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
    # a progress bar per variant and phase, on stderr (stdout keeps the results)
    for bar in ("base seed 0: measure 3 sites", "sft seed 0: train", "sft seed 1: measure 3 sites",
                "sft seed 0: sandbox 1 tasks"):  # fmt: skip
        assert bar in r.stderr and bar not in r.stdout, bar
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
    # the GRPO variant reports how far GRPO moved the weights; weights it left alone are not measured again
    for g in (x for x in runs if x["variant"] == "sft+sdpo+dpo+grpo"):
        full = next(x for x in runs if x["variant"] == "sft+sdpo+dpo" and x["seed"] == g["seed"])
        assert g["grpo_weight_change"] >= 0
        if g["grpo_weight_change"] == 0:
            assert g["metrics"] == full["metrics"] and g["eval_seconds"] == 0 and "unchanged" in g["measured"]
        else:
            assert g["eval_seconds"] > 0 and "measured" not in g

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
        (["--grpo-generations", "1"], "--grpo-generations 1"),
        (["--grpo-temperature", "0"], "--grpo-temperature 0.0"),
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


def test_bfloat16_runs_are_measured_and_cached_apart(folders, tmp_path):
    """``--dtype bfloat16`` trains and measures in bf16 (weights and compute), and its runs never answer
    for a float32 run of the same settings (the run key holds the dtype)."""
    train, held = folders
    out = tmp_path / "learning.json"
    common = ["--train-sessions", str(train), "--eval-sessions", str(held), "--out", str(out), "--model", "tiny",
              "--seeds", "1", "--steps", "2", "--lr", "0.01", "--variants", "base,sft+sdpo_on_policy,sft+sdpo+dpo+grpo",
              "--sandbox-tasks", "fix_import", "--grpo-steps", "1",
              "--metrics", "recovery_ce,hinted_jsd,valid_rate", "--max-new-tokens", "8"]  # fmt: skip
    r = bench(*common, "--dtype", "bfloat16")
    assert r.returncode == 0, r.stderr[-3000:]
    # emulated bf16 (no AVX512-BF16 / AMX) is several times slower than float32: the script says so
    assert ("without AVX512-BF16 or AMX" in r.stderr) == (not _module().bf16_native())
    bf16 = json.loads(out.read_text())
    assert bf16["config"]["dtype"] == "bfloat16"
    for name in ("base", "sft+sdpo_on_policy", "sft+sdpo+dpo+grpo"):
        assert math.isfinite(bf16["variants"][name]["recovery_ce"]["mean"]), name
    runs = [json.loads(x) for x in out.with_suffix(".runs.jsonl").read_text().splitlines()]
    assert all(x["channels"]["loss/sdpo_jsd"] > 0 for x in runs if x["variant"] != "base")

    r = bench(*common)  # float32: every run again, not the bf16 ones from the cache
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count(" seed 0: ") == 3
    fp32 = json.loads(out.read_text())
    assert fp32["config"]["dtype"] == "float32"
    ce = {d: v["variants"]["base"]["recovery_ce"]["mean"] for d, v in (("bf16", bf16), ("fp32", fp32))}
    assert ce["bf16"] != ce["fp32"] and ce["bf16"] == pytest.approx(ce["fp32"], rel=0.02)


def test_run_key_ignores_only_the_settings_of_channels_a_variant_lacks(folders):
    mod = _module()
    train, held = folders
    base = ["--train-sessions", str(train), "--eval-sessions", str(held), "--out", "o.json"]

    def keys(*extra: str) -> dict[str, str]:
        a = mod.parse_args([*base, *extra])
        a.lora_targets = "x"
        return {n: mod.run_key(a, n, 0, "data") for n in mod.VARIANTS}

    default = keys()
    sdpo3 = keys("--sdpo-weight", "3")  # SFT and base keep their keys; every SDPO variant gets a new one
    assert [n for n in default if default[n] != sdpo3[n]] == [
        "sft+sdpo_recorded", "sft+sdpo_on_policy", "sft+sdpo+dpo", "sft+sdpo+dpo+grpo"]  # fmt: skip
    pairs = keys("--dpo-pairs", "recovery")
    assert [n for n in default if default[n] != pairs[n]] == ["sft+sdpo+dpo", "sft+sdpo+dpo+grpo"]
    temp = keys("--on-policy-temperature", "0.5")  # the recorded-response variant samples nothing
    assert [n for n in default if default[n] != temp[n]] == [
        "sft+sdpo_on_policy", "sft+sdpo+dpo", "sft+sdpo+dpo+grpo"]  # fmt: skip
    assert keys("--grpo-steps", "5")["sft+sdpo+dpo"] == default["sft+sdpo+dpo"]
    lr = keys("--lr", "0.002")  # a training setting moves every trained variant, not the base model
    assert [n for n in default if default[n] != lr[n]] == list(default)[1:]
    assert keys("--dtype", "bfloat16")["base"] != default["base"]


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_learning", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bf16_native_reads_the_cpu_flags():
    mod = _module()
    zen3 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    zen4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    spr = "flags\t\t: avx2 amx_bf16 amx_tile\n"
    assert not mod.bf16_native(zen3)
    assert mod.bf16_native(zen4) and mod.bf16_native(spr)
    assert mod.bf16_native("")  # nothing to read: no claim, no warning
