"""Nothing is paid for before every later stage can run: trackers without their package or key, a plot
without matplotlib, no room for the trained models. The real CLI against the loopback OpenRouter server;
a missing package is simulated by shadowing it with one that fails to import (as a broken install does)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from composer_replication.config.run import RunConfig
from composer_replication.pipeline.manifest import Manifest
from composer_replication.pipeline.preflight import (
    PreflightError,
    check_trackers,
    disk_needed,
    disk_problem,
    wandb_credentials_missing,
)
from composer_replication.pipeline.runner import RunContext
from composer_replication.teacher_replay.fake_server import FakeOpenRouter

REPO = Path(__file__).resolve().parents[2]
SESSION = (
    REPO
    / "tests/data/sessions/claude_code/d-kimuson__claude-code-viewer__5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
)
TRACKERS = ("wandb", "tensorboard", "trackio")


def _config(tmp_path: Path, srv: FakeOpenRouter, **train: object) -> Path:
    (tmp_path / "sessions").mkdir(exist_ok=True)
    shutil.copy(SESSION, tmp_path / "sessions" / SESSION.name)
    cfg = {
        "student": {"name": "tiny"},
        "sources": {"paths": ["sessions"], "heldout_fraction": 0.0},
        "replay": {"teachers": srv.teachers(("t/a", "t/b"), price=(1.0, 2.0)), "max_total_usd": 1.0,
                   "max_tokens": 32, "history_messages": 4, "concurrency": 1},
        "normalize": {"skip_dj": True},
        "train": {"schedule": {"max_steps": 1, "batch_size": 1}, "logging": {"plot": False, "progress": False},
                  **train},
        "evaluate": {"sandbox_tasks": False},
    }  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _shadow(tmp_path: Path, *modules: str) -> str:
    """A PYTHONPATH on which each of ``modules`` fails to import, as if it were not installed."""
    shadow = tmp_path / "shadow"
    for m in modules:
        (shadow / m).mkdir(parents=True, exist_ok=True)
        (shadow / m / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{m}'\", name='{m}')\n"
        )
    return os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])


def _run(tmp_path: Path, cfg: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "NETRC"))}
    full = {**clean, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HOME": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "-m", "composer_replication.cli.main", "run", str(cfg), "--out", str(tmp_path / "run"),
         "--until", "train_offline"],
        env=full, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_wandb_without_package_or_key_is_found_before_replay_pays(tmp_path):
    """The issue's case: report_to [wandb], wandb not installed and no key: `run` used to pay, then fail."""
    with FakeOpenRouter() as srv:
        cfg = _config(tmp_path, srv, logging={"report_to": ["wandb"], "plot": False, "progress": False})
        p = _run(tmp_path, cfg, {"PYTHONPATH": _shadow(tmp_path, "wandb")})
        assert p.returncode == 1, p.stderr[-3000:]
        assert srv.n_requests == 0  # nothing sent, nothing paid
    err = p.stderr
    assert "no money spent" in err and "Traceback" not in err
    assert "train_offline: train.logging.report_to lists wandb, which does not import" in err
    assert "pip install 'composer-replication[wandb]'" in err
    assert "no W&B API key" in err and "WANDB_MODE=offline" in err  # the key is missing too: both fixes named
    assert not (tmp_path / "run" / "replay" / "ledger.jsonl").exists()
    assert Manifest.load(tmp_path / "run").stages["replay"].status == "failed"


def test_every_missing_tracker_and_the_plot_are_named_in_one_error(tmp_path):
    with FakeOpenRouter() as srv:
        cfg = _config(tmp_path, srv, logging={"report_to": list(TRACKERS), "plot": True, "progress": False})
        p = _run(
            tmp_path,
            cfg,
            {"PYTHONPATH": _shadow(tmp_path, *TRACKERS, "matplotlib"), "WANDB_API_KEY": "x" * 40},
        )
        assert p.returncode == 1 and srv.n_requests == 0, p.stderr[-3000:]
    err = p.stderr
    for name in TRACKERS:
        assert f"report_to lists {name}, which does not import" in err, err
    assert "no W&B API key" not in err  # WANDB_API_KEY is set
    assert "x" * 40 not in err  # and never shown
    assert "train.logging.plot (losses.png) needs matplotlib" in err and "train.logging.plot: false" in err


def test_an_offline_wandb_needs_no_key_and_none_is_no_tracker(tmp_path, monkeypatch):
    """No false alarm: with WANDB_MODE=offline the key check passes; `none` is not a tracker to import."""
    from composer_replication._extras import is_available

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("NETRC", raising=False)
    cfg = RunConfig.model_validate(
        {"sources": {"paths": []}, "train": {"logging": {"report_to": ["wandb", "none"]}}}
    )
    ctx = RunContext(tmp_path / "run", cfg)
    for mode, key_problem in (("offline", False), ("online", True)):
        monkeypatch.setenv("WANDB_MODE", mode)
        problems = []
        try:
            check_trackers(ctx)
        except PreflightError as exc:
            problems = str(exc).split("; ")
        assert any("W&B API key" in p for p in problems) == key_problem
        assert any("which does not import" in p for p in problems) == (not is_available("wandb"))
        assert len(problems) == key_problem + (not is_available("wandb"))  # nothing about `none`


def test_wandb_credentials_from_env_netrc_or_offline_mode(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    missing = wandb_credentials_missing({"HOME": str(home)})
    assert missing is not None and "WANDB_API_KEY" in missing and "wandb login" in missing
    assert wandb_credentials_missing({"HOME": str(home), "WANDB_API_KEY": "k" * 40}) is None
    assert wandb_credentials_missing({"HOME": str(home), "WANDB_MODE": "offline"}) is None
    assert wandb_credentials_missing({"HOME": str(home), "WANDB_MODE": "disabled"}) is None
    (home / ".netrc").write_text("machine example.com login user password p\n")
    assert wandb_credentials_missing({"HOME": str(home)}) is not None  # another host's entry is not W&B's
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "s" * 40 + "\n")
    os.chmod(home / ".netrc", 0o600)
    assert wandb_credentials_missing({"HOME": str(home)}) is None  # what `wandb login` writes
    assert (
        wandb_credentials_missing({"HOME": str(home), "WANDB_BASE_URL": "https://wandb.corp.example"})
        is not None
    )
    other = tmp_path / "netrc"
    other.write_text("machine wandb.corp.example login user password q\n")
    os.chmod(other, 0o600)
    env = {"HOME": str(home), "NETRC": str(other), "WANDB_BASE_URL": "https://wandb.corp.example"}
    assert wandb_credentials_missing(env) is None
    (home / ".netrc").write_text("machine api.wandb.ai login\n")  # unparsable: no key, not a crash
    assert "no W&B API key" in (wandb_credentials_missing({"HOME": str(home)}) or "")


def test_no_room_for_the_trained_models_is_found_before_paying(tmp_path):
    student = tmp_path / "student"
    student.mkdir()
    size = shutil.disk_usage(tmp_path).free // 3 + 4096  # three copies do not fit
    with open(student / "model.safetensors", "wb") as f:  # sparse: takes no space
        f.truncate(size)
    (student / "notes.txt").write_text("not weights")
    cfg = RunConfig.model_validate({"student": {"name": str(student)}, "sources": {"paths": []},
                                    "train": {"checkpoint": {"keep_last": 2}}, "grpo": {"enabled": True}})  # fmt: skip
    ctx = RunContext(tmp_path / "run", cfg)
    need, w = disk_needed(ctx, ["train_offline", "train_grpo", "evaluate"])
    assert w == size and need == w * (1 + 2 + 1 + 2)  # finals and full-weight checkpoints of both phases
    assert disk_needed(ctx, ["pairs", "normalize"]) == (0, 0)  # nothing trained in this invocation
    lora = cfg.model_copy(
        update={
            "train": cfg.train.model_copy(
                update={"lora": cfg.train.lora.model_copy(update={"enabled": True})}
            )
        }
    )
    assert disk_needed(RunContext(tmp_path / "run", lora), ["train_offline"]) == (w, w)  # adapters only
    why = disk_problem(ctx, ["train_offline"])
    assert why is not None and "GiB free" in why and "--out" in why and "keep_last" in why
    (student / "model.safetensors").write_bytes(b"\0" * 1024)
    assert disk_problem(ctx, ["train_offline", "train_grpo"]) is None
