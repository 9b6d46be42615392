"""`composer-replication run` as a user (or a second user) drives it: real processes, real files, a
loopback teacher server. One run directory, one process; no payment before every later stage can
run; an overcharge stops the run loudly; a directory made by another config is not taken over."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from composer_replication.pipeline.manifest import Manifest
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, Reply

REPO = Path(__file__).resolve().parents[2]
SESSION = (
    REPO
    / "tests/data/sessions/claude_code/d-kimuson__claude-code-viewer__5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
)


def small_config(tmp_path: Path, srv: FakeOpenRouter, name: str = "run.yaml", key_env: str | None = None,
                 **over) -> Path:  # fmt: skip
    """One real session, two loopback teachers, the tiny student, nothing that needs a sandbox.
    ``key_env``: the teachers' API key comes from this variable (the server records who sent what)."""
    extra = {"api_key_env": key_env} if key_env else {}
    (tmp_path / "sessions").mkdir(exist_ok=True)
    shutil.copy(SESSION, tmp_path / "sessions" / SESSION.name)
    cfg = {
        "student": {"name": "tiny"},
        "sources": {"paths": ["sessions"], "heldout_fraction": 0.0},
        "replay": {"teachers": srv.teachers(("t/a", "t/b"), price=(1.0, 2.0), **extra), "max_total_usd": 1.0,
                   "max_tokens": 32, "history_messages": 4, "concurrency": 1},
        "normalize": {"skip_dj": True},
        "train": {"schedule": {"max_steps": 1, "batch_size": 1}, "logging": {"plot": False, "progress": False}},
        "evaluate": {"sandbox_tasks": False},
    }  # fmt: skip
    for k, v in over.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.run([sys.executable, "-m", "composer_replication.cli.main", *args], env=full,
                          capture_output=True, text=True, timeout=300, **kw)  # fmt: skip


def test_second_run_on_a_busy_directory_fails_at_once_naming_the_pid(tmp_path):
    with FakeOpenRouter(latency_s=5.0) as srv:
        # Each run sends its own key, so the server tells their requests apart (the first run keeps calling
        # while the second starts, however slow this machine is).
        cfg, run = small_config(tmp_path, srv, key_env="CR_TEST_RUN_KEY"), tmp_path / "run"
        first = subprocess.Popen([sys.executable, "-m", "composer_replication.cli.main", "run", str(cfg), "--out",
                                  str(run), "--until", "pairs"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env={**os.environ, "CR_TEST_RUN_KEY": "first-run"})  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while srv.n_requests == 0:  # the first run is inside replay, mid-call
                assert time.monotonic() < deadline and first.poll() is None, first.communicate()
                time.sleep(0.1)
            t0 = time.monotonic()
            second = cli(
                "run", str(cfg), "--out", str(run), "--until", "pairs", env={"CR_TEST_RUN_KEY": "second-run"}
            )
            assert second.returncode == 1 and time.monotonic() - t0 < 30, second.stderr[-2000:]
            assert f"in use by pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
            st = cli("status", str(run), "--json")
            assert f"pid {first.pid}" in json.loads(st.stdout)["in_use_by"]
            assert srv.seen_auth == {"Bearer first-run"}  # the second run sent nothing
        finally:
            (run / "STOP").touch()  # the first run stops at its next poll (exit 3)
            out, err = first.communicate(timeout=120)
    assert first.returncode == 3, err[-2000:]


def test_overcharge_stops_the_run_with_a_nonzero_exit_and_shows_in_status(tmp_path):
    with FakeOpenRouter(script=lambda info: Reply(cost=1000.0)) as srv:
        cfg, run = small_config(tmp_path, srv, replay={"max_total_usd": 0.05}), tmp_path / "run"
        p = cli("run", str(cfg), "--out", str(run), "--until", "pairs")
        assert p.returncode == 4, p.stderr[-3000:]
        assert "spend overrun" in p.stderr and "Traceback" not in p.stderr
        assert srv.n_requests == 1  # concurrency 1: nothing was sent after the first bill
        rec = Manifest.load(run).stages["replay"]
        assert rec.status == "done" and rec.summary["overrun"] is True and rec.summary["spent_usd"] >= 1000
        assert Manifest.load(run).stages["pairs"].status == "pending"
        st = cli("status", str(run))
        assert (
            "OVERRUN" in st.stdout and json.loads(cli("status", str(run), "--json").stdout)["overrun"] is True
        )
        again = cli("run", str(cfg), "--out", str(run), "--until", "pairs")  # seen it: continue
        assert again.returncode == 0 and srv.n_requests == 1, again.stderr[-2000:]


def test_missing_ray_is_found_before_replay_pays_anything(tmp_path):
    # data_juicer.core imports ray; simulate an install of the data-juicer extra without it.
    shadow = tmp_path / "shadow"
    (shadow / "ray").mkdir(parents=True)
    (shadow / "ray" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n"
    )
    with FakeOpenRouter() as srv:
        cfg, run = small_config(tmp_path, srv, normalize={"skip_dj": False}), tmp_path / "run"
        path = os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])
        p = cli("run", str(cfg), "--out", str(run), "--until", "normalize", env={"PYTHONPATH": path})
        assert p.returncode == 1, p.stderr[-3000:]
        assert srv.n_requests == 0  # nothing sent, nothing paid
    assert "normalize" in p.stderr and "ray" in p.stderr and "pip install" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (run / "replay" / "ledger.jsonl").exists()
    assert Manifest.load(run).stages["replay"].status == "failed"


def test_a_student_that_cannot_load_is_found_before_replay_pays_anything(tmp_path):
    with FakeOpenRouter() as srv:
        cfg, run = (
            small_config(tmp_path, srv, student={"name": str(tmp_path / "no-such-model")}),
            tmp_path / "run",
        )
        p = cli("run", str(cfg), "--out", str(run))  # the whole pipeline: every later stage is checked
        assert p.returncode == 1 and srv.n_requests == 0, p.stderr[-3000:]
    assert "train_offline" in p.stderr and "no-such-model" in p.stderr and "no money spent" in p.stderr


def test_data_juicer_extra_brings_ray():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.split("[")[0].split("=")[0].split(">")[0].strip() == "ray" for d in extras["data-juicer"])


def test_a_directory_made_by_another_config_is_refused_unless_forced(tmp_path):
    with FakeOpenRouter() as srv:
        cfg_a, run = small_config(tmp_path, srv), tmp_path / "run"
        cfg_b = small_config(tmp_path, srv, name="other.yaml", seed=1)
        assert cli("run", str(cfg_a), "--out", str(run), "--until", "split").returncode == 0
        before = Manifest.load(run).data
        p = cli("run", str(cfg_b), "--out", str(run), "--until", "split")
        assert p.returncode == 1 and "created by" in p.stderr and "--force" in p.stderr, p.stderr[-2000:]
        assert Manifest.load(run).data["config_hash"] == before["config_hash"]  # untouched
        p = cli("run", str(cfg_b), "--out", str(run), "--until", "split", "--force")
        assert p.returncode == 0, p.stderr[-2000:]
        assert Manifest.load(run).data["origin"] == str(cfg_b.resolve())


def test_ledger_with_a_negative_total_is_rejected_before_sending(tmp_path):
    # what the negative-cost bug left behind: a credit of $105k that would fund later runs
    run = tmp_path / "run"
    (run / "replay").mkdir(parents=True)
    (run / "replay" / "ledger.jsonl").write_text('{"event":"settle","id":"x-0","usd":-105000.0}\n')
    states = tmp_path / "states.jsonl"
    states.write_text(json.dumps({"state_id": "s", "messages": [], "student_action": "x"}) + "\n")
    with FakeOpenRouter() as srv:
        p = cli("replay", str(states), "--out", str(run / "replay"), "--base-url", srv.base_url,
                "--teachers", "t/a=1:1", "--max-usd", "1", "--no-progress")  # fmt: skip
        assert p.returncode == 1 and "ledger.jsonl:1" in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert srv.n_requests == 0
    Manifest(run).save()
    st = cli("status", str(run))
    assert st.returncode == 1 and "ledger.jsonl:1" in st.stderr and "Traceback" not in st.stderr


@pytest.fixture()
def slow_stage_script(tmp_path):
    """A real process running the real Runner with the run's kill switch over a stage that never polls
    (like ``report``): SIGINT during it must still end the run with the kill switch's exit code."""
    script = tmp_path / "slow.py"
    script.write_text(f"""
import sys, time
from pathlib import Path
from composer_replication.cli.main import main
from composer_replication.pipeline import stages
from composer_replication.pipeline.runner import Stage

def slow(ctx):
    print("slow stage running", flush=True)
    time.sleep(3)
    ctx.path("out.txt").write_text("done")
    return {{}}

stages.build_stages = lambda: [Stage("report", (), lambda c: [], lambda c: [c.path("out.txt")], slow)]
sys.exit(main(["run", {str(tmp_path / "c.yaml")!r}, "--out", {str(tmp_path / "run")!r}]))
""")
    (tmp_path / "c.yaml").write_text("sources: {paths: []}\n")
    return script


def test_ctrl_c_during_a_stage_that_never_polls_exits_nonzero(slow_stage_script, tmp_path):
    import signal

    p = subprocess.Popen([sys.executable, str(slow_stage_script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    for line in p.stdout:
        if "slow stage running" in line:
            break
    else:
        raise AssertionError(p.communicate())
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err[-2000:]
    assert (
        "SIGINT" in err and (tmp_path / "run" / "out.txt").exists()
    )  # the stage finished, then the run stopped
    assert Manifest.load(tmp_path / "run").stages["report"].status == "done"


def _interrupt_when(args: list[str], marker: str, env: dict | None = None) -> tuple[int, str]:
    """Run the CLI; send SIGINT (Ctrl-C) as soon as ``marker`` appears in its output."""
    import signal

    full = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    p = subprocess.Popen([sys.executable, "-m", "composer_replication.cli.main", *args], env=full,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines = []
    for line in p.stdout:
        lines.append(line)
        if marker in line:
            p.send_signal(signal.SIGINT)
            break
    lines.append(p.communicate(timeout=600)[0])
    return p.returncode, "".join(lines)


@pytest.mark.slow
def test_ctrl_c_in_grpo_then_rerun_ends_at_max_steps_and_ctrl_c_in_report_exits_nonzero(tmp_path):
    with FakeOpenRouter() as srv:
        cfg = small_config(tmp_path, srv, grpo={"enabled": True, "max_steps": 1, "tasks": ["off_by_one", "fix_import"]},
                           train={"checkpoint": {"every_steps": 1}, "grpo": {"num_generations": 2, "max_completion_length": 8},
                                  "schedule": {"max_steps": 1, "batch_size": 1},
                                  "logging": {"plot": False, "progress": False}})  # fmt: skip
        run = tmp_path / "run"
        code, out = _interrupt_when(["run", str(cfg), "--out", str(run)], "[train_grpo] running")
        assert code == 3, out[-3000:]
        p = cli("run", str(cfg), "--out", str(run))
        assert p.returncode == 0, p.stderr[-3000:]
        summary = json.loads((run / "train" / "grpo" / "final_metrics.json").read_text())
        assert summary["steps"] == 1  # was 2 with max_steps 1
        assert sorted(c.name for c in (run / "train" / "grpo" / "checkpoints").glob("checkpoint-*")) == [
            "checkpoint-1"
        ]

        code, out = _interrupt_when(
            ["run", str(cfg), "--out", str(run), "--force", "report"], "[report] running"
        )
        assert code == 3 and "SIGINT" in out, out[-3000:]  # exited 0 before the fix
