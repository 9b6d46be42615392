"""Tasks, the rollout loop, Claude Code session logs, infra-error labelling, resume, and the docker argv."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from composer_replication.datagen.bwrap_sandbox import BwrapSandbox
from composer_replication.datagen.docker_sandbox import DockerSandbox, docker_available
from composer_replication.datagen.rollout import (
    ScriptedPolicy,
    oracle_policy,
    run_rollout,
    run_rollouts,
    trainable,
)
from composer_replication.datagen.sandbox import SandboxLimits
from composer_replication.datagen.tasks import Task, bundled_tasks, load_task
from composer_replication.datagen.tools import format_tool_call, parse_tool_calls
from composer_replication.safety import KillSwitch, KillSwitchTriggered

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def test_bundled_tasks_load_and_are_well_formed():
    tasks = bundled_tasks()
    assert set(tasks) >= {"off_by_one", "implement_function", "fix_import"}
    for t in tasks.values():
        assert t.files and t.solution and t.test_command and t.instruction
        assert set(t.solution) <= set(t.files)


def test_bad_task_files_name_the_field(tmp_path):
    (tmp_path / "task.json").write_text(json.dumps({"name": "x", "instruction": ""}))
    with pytest.raises(
        ValueError, match=r"task.json: missing or empty field\(s\) \['instruction', 'test_command'\]"
    ):
        load_task(tmp_path)
    (tmp_path / "task.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_task(tmp_path)


def test_parse_tool_calls():
    text = (
        "I'll fix it.\n"
        + format_tool_call("write", {"file_path": "a.py", "content": "x"})
        + "\n[TOOL_USE] name=Edit input={bad"
    )
    calls = parse_tool_calls(text)
    assert calls[0] == {"name": "Write", "input": {"file_path": "a.py", "content": "x"}}
    assert calls[1]["name"] == "_invalid"


@needs_bwrap
@pytest.mark.parametrize("name", ["off_by_one", "implement_function", "fix_import"])
def test_oracle_passes_and_doing_nothing_fails(name, tmp_path):
    task = bundled_tasks()[name]
    good = run_rollout(task, oracle_policy(task), log_dir=tmp_path)
    idle = run_rollout(task, ScriptedPolicy(["I give up."]), log_dir=tmp_path)
    assert (good.status, good.reward) == ("ok", 1.0), good.test_output
    assert (idle.status, idle.reward) == ("ok", 0.0)


@needs_bwrap
def test_session_log_is_ingested_like_a_claude_code_session(tmp_path):
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester

    task = bundled_tasks()["off_by_one"]
    policy = ScriptedPolicy(
        [
            "Let me look.\n" + format_tool_call("Read", {"file_path": "mathx.py"}),
            format_tool_call("Edit", {"file_path": "mathx.py", "old_string": "nope", "new_string": "x"}),
            format_tool_call(
                "Edit",
                {"file_path": "mathx.py", "old_string": "range(1, n)", "new_string": "range(1, n + 1)"},
            ),
            format_tool_call("Bash", {"command": task.test_command}),
            "Fixed the off-by-one.",
        ]
    )
    r = run_rollout(task, policy, rollout_id="obo", log_dir=tmp_path)
    assert r.reward == 1.0 and r.turns == 5
    records = [json.loads(x) for x in Path(r.session_log).read_text().splitlines()]
    assert records[0]["parentUuid"] is None
    assert all(b["parentUuid"] == a["uuid"] for a, b in zip(records, records[1:]))
    errors = [
        rec
        for rec in records
        if rec["type"] == "user"
        and isinstance(rec["message"]["content"], list)
        and rec["message"]["content"][0]["is_error"]
    ]
    assert len(errors) == 1 and errors[0]["toolUseResult"].startswith("Error:")
    ing = ClaudeCodeIngester()
    states = list(ing.ingest(Path(r.session_log)))
    assert [s["state_id"] for s in states] == [f"obo::{i:04d}" for i in range(5)]
    assert states[0]["student_action"].startswith("Let me look.\n\n[TOOL_USE] name=Read input=")
    result = states[2]["messages"][-1]
    assert result["role"] == "tool" and result["name"] == "Edit" and result["is_error"] is True
    assert states[-1]["student_action"] == "Fixed the off-by-one."


@needs_bwrap
def test_infra_failure_is_labelled_and_excluded(tmp_path):
    task = bundled_tasks()["fix_import"]
    broken = run_rollout(
        task, oracle_policy(task), sandbox_factory=lambda: BwrapSandbox(bwrap=str(tmp_path / "none"))
    )
    assert broken.status == "infra_error" and broken.reward is None and "bubblewrap" in broken.error
    ok = run_rollout(task, oracle_policy(task))
    assert trainable([broken, ok]) == [ok]


@needs_bwrap
def test_run_rollouts_resumes_and_retries_infra_errors(tmp_path):
    tasks = [bundled_tasks()["off_by_one"], bundled_tasks()["fix_import"]]
    calls = []

    def factory():  # two sandboxes a rollout (the agent's, the verifier's): the 3rd is fix_import's
        calls.append(1)
        return BwrapSandbox(bwrap="/nonexistent/bwrap") if len(calls) == 3 else BwrapSandbox()

    first = run_rollouts(tasks, oracle_policy, tmp_path, progress=False, sandbox_factory=factory)
    assert [(r.task, r.status) for r in first] == [("off_by_one", "ok"), ("fix_import", "infra_error")]
    second = run_rollouts(tasks, oracle_policy, tmp_path, progress=False)
    assert [(r.task, r.status, r.reward) for r in second] == [("fix_import", "ok", 1.0)]
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == [
        "fix_import-000.jsonl",
        "off_by_one-000.jsonl",
    ]


@needs_bwrap
def test_rollout_reports_violations_and_stops_on_kill_switch(tmp_path):
    task = bundled_tasks()["off_by_one"]
    policy = ScriptedPolicy(
        [format_tool_call("Bash", {"command": "curl http://169.254.169.254/ || cat /etc/shadow"})] * 3
    )
    with KillSwitch(log_path=tmp_path / "ks.jsonl", handle_signals=False) as sw:
        with pytest.raises(KillSwitchTriggered, match="sandbox policy: secrets|sandbox policy: network"):
            run_rollout(task, policy, stop=sw, log_dir=tmp_path)
    assert len(sw.violations) == 2  # both rules, from the one command that ran before the stop


def test_task_from_repo_snapshot(tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("A = 1\n")
    (repo / "untracked.py").write_text("B = 2\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "a.py"], check=True)
    t = Task.from_repo(repo, name="r", instruction="do", test_command="true")
    assert t.files == {"a.py": "A = 1\n"}


def test_docker_argv_is_locked_down():
    sb = DockerSandbox(SandboxLimits(memory_mb=512, nproc=64, fsize_mb=8, cpu_s=20), image="python:3.11-slim")
    run = sb.run_argv()
    joined = " ".join(run)
    for flag in [
        "--network none",
        "--read-only",
        "--user 0:0",  # the init: out of the commands' reach (they run as 65534, below)
        "--memory 512m",
        "--memory-swap 512m",
        "--pids-limit 64",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--cpus 1.0",
        f"--ulimit fsize={8 * 1024 * 1024}:{8 * 1024 * 1024}",
        "--ulimit cpu=20:21",
    ]:
        assert flag in joined, flag
    assert run[-3:] == ["python:3.11-slim", "sleep", "infinity"]
    assert any(a.startswith("/workspace:rw,exec,size=") for a in run)
    exec_argv = sb.exec_argv("pytest -q", 7)
    assert exec_argv[-2:] == ["7", "pytest -q"] and "timeout --signal=KILL" in exec_argv[-5]
    assert exec_argv[:6] == ["docker", "exec", "-u", "65534:65534", "-w", "/workspace"]
    assert DockerSandbox(executable="podman", runtime="runsc").run_argv()[:2] == ["podman", "run"]
    assert "--runtime" in DockerSandbox(runtime="runsc").run_argv()
    from composer_replication.datagen.sandbox import Sandbox

    assert isinstance(sb, Sandbox) and isinstance(BwrapSandbox(), Sandbox)


@pytest.mark.skipif(
    not docker_available() and os.environ.get("CR_REQUIRE_DOCKER") != "1",
    reason="no Docker daemon answers here (scripts/test.sh starts one with scripts/dockerd.sh)",
)
def test_docker_live_round_trip():
    from composer_replication.datagen.docker_image import ensure_image

    ensure_image()  # built locally from this host's Python; no registry
    with DockerSandbox() as sb:
        sb.put("x/y.txt", "hi")
        assert sb.get("x/y.txt") == b"hi"
        r = sb.exec("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)'", 10)
        assert r.returncode != 0
        assert sb.exec("sleep 30", 1).timed_out


def test_light_imports():
    import subprocess
    import sys

    code = (
        "import sys, composer_replication.safety, composer_replication.datagen.sandbox, "
        "composer_replication.datagen.docker_sandbox, composer_replication.datagen.rollout;"
        "bad = [m for m in ('transformers', 'trl', 'docker', 'monarch', 'httpx') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@needs_bwrap
def test_hf_policy_rollout_with_tiny_model(tiny_tokenizer, tmp_path):
    from composer_replication.datagen.rollout import HFPolicy
    from composer_replication.models import build_tiny_model

    task = bundled_tasks()["off_by_one"]
    policy = HFPolicy(build_tiny_model(tokenizer=tiny_tokenizer, seed=0), tiny_tokenizer, max_new_tokens=24)
    r = run_rollout(task, policy, rollout_id="tiny", log_dir=tmp_path, max_turns=2)
    # A random model emits no valid tool call: one turn, the tests run on the untouched files and fail.
    assert (r.status, r.reward, r.turns) == ("ok", 0.0, 1)
    records = [json.loads(x) for x in Path(r.session_log).read_text().splitlines()]
    assert [rec["type"] for rec in records] == ["user", "assistant", "system"]
    assert records[1]["message"]["content"][0]["type"] == "text"
    assert (r.end_reason, records[2]["subtype"], records[2]["content"]) == (
        "done",
        "rollout_end",
        "Rollout ended: done",
    )
    assert records[1]["message"]["usage"]["output_tokens"] == r.tokens > 0  # the tokenizer's count
