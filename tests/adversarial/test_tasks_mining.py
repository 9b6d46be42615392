"""Hostile sessions and repositories for `tasks mine`: nothing outside the repository enters a task, no secret
passes the redactor, nothing is written outside TASKS, each problem gets one line, nothing crashes."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "tasks"))

from _mining import TEST_CALC, ClaudeSession, CodexSession, commit, make_repo  # noqa: E402

from composer_replication.datagen.tasks import TaskFileError, load_task  # noqa: E402
from composer_replication.tasks import Options, mine_tasks  # noqa: E402

FIX = ("def sub(a, b):\n    return a + b", "def sub(a, b):\n    return a - b")
SECRET = "AKIA" + "Z7Q2" * 4
PASSWD = Path("/etc/passwd").read_text()[:40]


def _mine(logs, out):
    lines: list[str] = []
    report = mine_tasks([logs], out, options=Options(timeout_s=10.0), sandbox="bwrap", log=lines.append)
    return report, lines


def _fixing(repo, request="fix sub", *, path=None):
    s = ClaudeSession(str(repo)).user(request).bash("python -m pytest -q", "1 failed", exit_code=1)
    return s.edit(path or f"{repo}/calc.py", *FIX).bash("python -m pytest -q", "2 passed")


@pytest.mark.parametrize(
    "target",
    [
        "/etc/cron.d/evil",
        "{repo}/../evil.py",
        "{repo}/.git/hooks/pre-commit",
        "{repo}/link/evil",
        "{repo}/loop/x",
    ],
)
def test_edits_outside_the_repository_are_refused_and_nothing_is_written_there(tmp_path, target):
    repo = tmp_path / "repo"
    make_repo(repo)
    os.symlink("/etc", repo / "link")
    os.symlink("loop", repo / "loop")
    commit(repo, {})
    s = _fixing(repo).write(target.format(repo=repo), "pwned\n")
    s.save(tmp_path / "logs")
    report, lines = _mine(tmp_path / "logs", tmp_path / "T")
    (ep,) = report["sessions"][0]["episodes"]
    assert ep["status"] == "dropped" and ep["reason"] == "edits outside the repository", ep
    assert len([ln for ln in lines if "edits outside the repository" in ln and "session" in ln]) == 1
    assert not (tmp_path / "evil.py").exists() and not (repo / ".git" / "hooks" / "pre-commit").exists()


def test_codex_patch_paths_cannot_leave_the_repository(tmp_path):
    repo = tmp_path / "repo"
    make_repo(repo)
    s = CodexSession(str(repo)).user("fix").shell("pytest -q", "1 failed", exit_code=1)
    s.apply_patch("*** Add File: ../../escaped.py\n+x = 1").shell("pytest -q", "ok").save(tmp_path / "logs")
    report, _ = _mine(tmp_path / "logs", tmp_path / "T")
    assert report["sessions"][0]["episodes"][0]["reason"] == "edits outside the repository"


def test_a_symlink_leaving_the_repository_is_never_followed_into_a_task(tmp_path):
    repo = tmp_path / "repo"
    make_repo(repo)
    os.symlink("/etc/passwd", repo / "leak.txt")
    os.symlink("../../../../../../etc/passwd", repo / "relative_leak.txt")
    commit(repo, {})
    _fixing(repo).save(tmp_path / "logs")
    report, _ = _mine(tmp_path / "logs", tmp_path / "T")
    (ep,) = report["sessions"][0]["episodes"]
    assert ep["status"] == "validated", ep
    folder = tmp_path / "T" / ep["task"]
    everything = "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())
    assert PASSWD not in everything
    assert not any(p.is_symlink() for p in folder.rglob("*"))
    left = tomllib.loads((folder / "task.toml").read_text())["metadata"]["left_out"]
    assert any(x.startswith("leak.txt: a symlink") for x in left)


def test_secrets_in_requests_files_and_check_commands_do_not_reach_the_task(tmp_path):
    repo = tmp_path / "repo"
    make_repo(repo, {"calc.py": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n",
                     "settings.py": f'AWS_ACCESS_KEY_ID = "{SECRET}"\n', "test_calc.py": TEST_CALC})  # fmt: skip
    s = _fixing(repo, f"fix sub; creds: AWS_ACCESS_KEY_ID={SECRET}")
    s.bash(f"AWS_ACCESS_KEY_ID={SECRET} python -m pytest -q -k {SECRET}", "2 passed")
    s.save(tmp_path / "logs")
    report, _ = _mine(tmp_path / "logs", tmp_path / "T")
    (ep,) = report["sessions"][0]["episodes"]
    assert ep["status"] == "validated", ep
    folder = tmp_path / "T" / ep["task"]
    for p in folder.rglob("*"):
        if p.is_file():
            assert SECRET not in p.read_text(errors="replace"), p
    assert SECRET not in (tmp_path / "T" / "report.json").read_text()
    assert tomllib.loads((folder / "task.toml").read_text())["verifier"]["checks"] == [
        "python3 -m pytest -q -p no:cacheprovider"
    ]


def test_hostile_session_ids_stay_inside_the_tasks_directory(tmp_path):
    repo = tmp_path / "repo"
    make_repo(repo)
    s = _fixing(repo)
    s.sid = "../../../../tmp/evil"
    for r in s.records:
        r["sessionId"] = s.sid
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in s.records))
    report, _ = _mine(tmp_path / "logs", tmp_path / "deep" / "T")
    (ep,) = report["sessions"][0]["episodes"]
    assert ep["status"] == "validated" and "/" not in ep["task"] and ".." not in ep["task"]
    assert (tmp_path / "deep" / "T" / ep["task"]).is_dir()
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil-t001").exists()


def test_garbage_and_truncated_session_files_do_not_stop_the_others(tmp_path):
    repo = tmp_path / "repo"
    make_repo(repo)
    logs = tmp_path / "logs"
    _fixing(repo).save(logs)
    (logs / "garbage.jsonl").write_bytes(b"\x00\xff{not json\n" * 50)
    (logs / "list.jsonl").write_text('[1, 2]\n{"type": "user", "message": 7, "cwd": 5}\n')
    os.mkfifo(logs / "fifo.jsonl")
    report, lines = _mine(logs, tmp_path / "T")
    assert report["counts"]["validated"] == 1
    assert any("fifo.jsonl" in s["path"] for s in report["skipped_files"])


def test_task_folders_with_links_out_are_refused_by_the_loader(tmp_path):
    d = tmp_path / "t"
    (d / "environment" / "repo").mkdir(parents=True)
    (d / "task.toml").write_text('[verifier]\nchecks = ["true"]\n')
    (d / "instruction.md").write_text("x\n")
    os.symlink("/etc/passwd", d / "environment" / "repo" / "leak")
    with pytest.raises(TaskFileError, match="outside the task root"):
        load_task(d)
    os.unlink(d / "environment" / "repo" / "leak")
    os.symlink("/etc", d / "environment" / "repo" / "dir")
    with pytest.raises(TaskFileError):
        load_task(d)
