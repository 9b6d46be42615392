"""`tasks mine` end to end: real git repositories, sessions in the real Claude Code and Codex formats, checks run
by the project's verifier in the sandbox (no network). One mining run over every case, then one test per
outcome: the passing tasks and each drop reason."""

from __future__ import annotations

import json
import shutil
import tomllib

import pytest
from _mining import (
    CALC,
    TEST_CALC,
    ClaudeSession,
    CodexSession,
    commit,
    fix_session,
    git,
    make_repo,
    now,
    set_reflog_times,
)

from composer_replication.datagen.tasks import load_task, load_tasks
from composer_replication.tasks import Options, mine_tasks

FIX = ("def sub(a, b):\n    return a + b", "def sub(a, b):\n    return a - b")
CALC_OK = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
KEY = "sk-ant-api03-" + "Q" * 80 + "AA"


def _session(repo, request, *, edit=FIX, tests="python -m pytest -q test_calc.py", path=None):
    s = ClaudeSession(str(repo))
    s.user(request).bash(tests, "1 failed", exit_code=1)
    s.edit(path or f"{repo}/calc.py", *edit)
    return s.bash(tests, "2 passed")


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    root = tmp_path_factory.mktemp("mine")
    logs, repos = root / "logs", root / "repos"
    cases: dict[str, str] = {}

    def add(name, session):
        session.save(logs)
        cases[name] = session.sid

    make_repo(repos / "ok")
    add("ok", _session(repos / "ok", f"sub() adds; fix it. my key is {KEY}"))
    make_repo(repos / "codex")
    cx = CodexSession(str(repos / "codex"))
    cx.user("make sub subtract").shell("pytest -q test_calc.py", "1 failed", exit_code=1)
    cx.apply_patch("*** Update File: calc.py\n@@ def sub(a, b):\n-    return a + b\n+    return a - b")
    add("codex", cx.shell("pytest -q test_calc.py", "2 passed"))
    add("gone", _session(root / "nowhere" / "proj", "fix"))
    make_repo(repos / "old", date="2030-01-01T00:00:00Z")
    git(repos / "old", "reflog", "expire", "--expire=now", "--all")
    add("no_commit", _session(repos / "old", "fix"))  # the only commit is dated after the session
    make_repo(repos / "notest")
    s = ClaudeSession(str(repos / "notest")).user("fix sub").edit(f"{repos}/notest/calc.py", *FIX)
    add("no_test", s.bash("git diff", "..."))
    make_repo(repos / "noapply")
    add("no_apply", _session(repos / "noapply", "fix", edit=("def sub(x, y):", "def sub(a, b):")))
    make_repo(repos / "passing", {"calc.py": CALC_OK, "test_calc.py": TEST_CALC})
    add("already", _session(repos / "passing", "tidy", edit=("def add(a, b):", "def add(a, b):  # sum")))
    make_repo(repos / "outside")
    add("outside", _session(repos / "outside", "fix", path=str(root / "elsewhere.py")))
    make_repo(
        repos / "hang",
        {
            "calc.py": CALC,
            "test_calc.py": TEST_CALC + "\n\ndef test_hang():\n    while True:\n        pass\n",
        },
    )
    add("timeout", _session(repos / "hang", "fix"))
    net = (
        TEST_CALC
        + "\n\ndef test_net():\n    import urllib.request\n    urllib.request.urlopen('http://example.com', timeout=3)\n"
    )
    make_repo(repos / "net", {"calc.py": CALC, "test_calc.py": net})
    add("network", _session(repos / "net", "fix"))
    make_repo(
        repos / "deps",
        {"calc.py": CALC, "test_calc.py": TEST_CALC, "requirements.txt": "cr-no-such-package\n"},
    )
    add("env", _session(repos / "deps", "fix"))
    make_repo(repos / "dirty")
    d = _session(repos / "dirty", "fix sub")
    d.user("now make add return a + b + 0").edit(
        f"{repos}/dirty/test_calc.py",
        "assert add(2, 3) == 5",
        "assert add(2, 3) == 5\n    assert add.__doc__ == 'sum'",
    )
    d.bash("python -m pytest -q test_calc.py", "1 failed", exit_code=1)
    d.edit(f"{repos}/dirty/calc.py", "def add(a, b):\n", "def add(a, b):\n    'sum'\n").bash(
        "python -m pytest -q test_calc.py", "2 passed"
    )
    add("dirty", d)  # fmt: skip
    out = root / "TASKS"
    lines: list[str] = []
    opts = Options(timeout_s=8.0, env_cache=root / "envs", pip_args=["--no-index", "--find-links", str(root)])
    report = mine_tasks([logs], out, options=opts, sandbox="bwrap", log=lines.append)
    return {
        "root": root,
        "out": out,
        "report": report,
        "lines": lines,
        "cases": cases,
        "opts": opts,
        "logs": logs,
    }


def episode(mined, case, n=0):
    sid = mined["cases"][case]
    row = next(s for s in mined["report"]["sessions"] if s["session_id"] == sid)
    return row, row["episodes"][n]


def test_a_passing_claude_session_becomes_a_validated_task(mined):
    _, ep = episode(mined, "ok")
    assert ep["status"] == "validated", ep
    folder = mined["out"] / ep["task"]
    task = load_task(folder)
    meta = tomllib.loads((folder / "task.toml").read_text())
    assert meta["verifier"]["fail_to_pass"] == ["python3 -m pytest -q -p no:cacheprovider test_calc.py"]
    assert "test_calc.py::test_sub" in meta["verifier"]["tests_fail_to_pass"]
    assert meta["metadata"]["session_id"] == mined["cases"]["ok"] and meta["metadata"]["turns"] == [1, 1]
    assert meta["metadata"]["commit_found_by"] == "reflog" and len(meta["metadata"]["commit"]) == 40
    assert task.solution == {"calc.py": CALC_OK}
    assert KEY not in task.instruction and "sub() adds" in task.instruction  # the redactor ran
    assert KEY not in "".join(p.read_text() for p in folder.rglob("*") if p.is_file())


def test_a_codex_rollout_with_apply_patch_becomes_a_task(mined):
    _, ep = episode(mined, "codex")
    assert ep["status"] == "validated", ep
    assert (
        tomllib.loads((mined["out"] / ep["task"] / "task.toml").read_text())["metadata"]["source"] == "codex"
    )


@pytest.mark.parametrize(
    "case, reason",
    [
        ("gone", "no repository"),
        ("no_commit", "commit not found"),
        ("no_test", "no test run"),
        ("no_apply", "patch does not apply"),
        ("already", "checks already pass at the start"),
        ("outside", "edits outside the repository"),
        ("timeout", "timeout"),
        ("network", "needs the network"),
        ("env", "environment build failed"),
    ],
)
def test_each_drop_reason_is_reported_with_one_line(mined, case, reason):
    _, ep = episode(mined, case)
    assert ep["status"] == "dropped" and ep["reason"] == reason, ep
    sid = mined["cases"][case]
    hits = [
        line for line in mined["lines"] if reason in line and (sid in line or ep.get("task", "~") in line)
    ]
    assert len(hits) == 1 and "\n" not in hits[0]
    assert mined["report"]["drop_reasons"][reason] >= 1


def test_a_later_episode_starts_on_the_earlier_uncommitted_changes(mined):
    _, first = episode(mined, "dirty", 0)
    _, second = episode(mined, "dirty", 1)
    assert first["status"] == "validated" and second["status"] == "validated", (first, second)
    meta = tomllib.loads((mined["out"] / second["task"] / "task.toml").read_text())["metadata"]
    assert meta["started_dirty"] is True and meta["uncommitted_at_start"] == ["calc.py"]
    start = load_task(mined["out"] / second["task"]).files
    assert "return a - b" in start["calc.py"]  # the first episode's fix is part of the start
    assert "add.__doc__" in start["test_calc.py"]  # the test the episode changed is handed over with it


def test_report_and_loader_agree(mined):
    rep = json.loads((mined["out"] / "report.json").read_text())
    assert rep["counts"]["tasks"] == len(load_tasks(mined["out"])) == rep["counts"]["validated"] == 4
    assert rep["counts"]["episodes"] == rep["counts"]["tasks"] + rep["counts"]["dropped"]
    assert not (mined["out"] / ".staging").exists()


def test_a_rerun_reuses_validated_tasks_and_mines_only_new_sessions(mined, tmp_path):
    out = tmp_path / "T"
    shutil.copytree(mined["out"], out)
    repo = mined["root"] / "repos" / "late"
    make_repo(repo)
    fix_session(repo).save(mined["logs"])
    ok = mined["root"] / "repos" / "ok"
    ok.rename(ok.with_name("ok-moved"))  # a validated task whose repository is gone now is kept
    try:
        lines: list[str] = []
        rep = mine_tasks([mined["logs"]], out, options=mined["opts"], sandbox="bwrap", log=lines.append)
    finally:
        ok.with_name("ok-moved").rename(ok)
    assert rep["counts"]["reused"] == 4 and rep["counts"]["validated"] == 1 and rep["counts"]["tasks"] == 5
    assert any("unchanged since the last run" in line for line in lines)
    assert sum("kept from an earlier run" in line and "no repository" in line for line in lines) == 1
    assert len(load_tasks(out)) == 5


def test_repo_map_finds_a_moved_checkout(mined, tmp_path):
    repo = tmp_path / "moved" / "proj"
    make_repo(repo)
    logs = tmp_path / "logs"
    _session("/home/someone/proj", "fix").save(logs)
    opts = Options(timeout_s=8.0, repo_map=[("/home/someone", str(tmp_path / "moved"))])
    rep = mine_tasks([logs], tmp_path / "T", options=opts, sandbox="bwrap", log=lambda _: None)
    assert rep["counts"]["validated"] == 1, rep["sessions"]


def test_a_session_begun_on_uncommitted_changes_is_reported(tmp_path):
    repo = tmp_path / "repo"
    make_repo(repo)
    logs = tmp_path / "logs"
    s = ClaudeSession(str(repo)).user("fix sub").read(f"{repo}/calc.py", CALC.replace("def add", "def plus"))
    s.bash("python -m pytest -q test_calc.py", "1 failed", exit_code=1).edit(f"{repo}/calc.py", *FIX)
    s.bash("python -m pytest -q test_calc.py", "2 passed").save(logs)
    s2 = ClaudeSession(str(repo)).user("rename").read(f"{repo}/calc.py", CALC.replace("def add", "def plus"))
    s2.bash("python -m pytest -q", "1 failed", exit_code=1).edit(
        f"{repo}/calc.py", "def plus(a, b):", "def add(a, b):"
    )
    s2.save(logs)
    lines: list[str] = []
    rep = mine_tasks(
        [logs], tmp_path / "T", options=Options(timeout_s=8.0), sandbox="bwrap", log=lines.append
    )
    kept, dropped = (rep["sessions"][i]["episodes"][0] for i in (0, 1))
    assert kept["status"] == "validated" and dropped["reason"] == "patch does not apply"
    assert "the session began on uncommitted changes to calc.py" in dropped["detail"]
    meta = tomllib.loads((tmp_path / "T" / kept["task"] / "task.toml").read_text())["metadata"]
    assert meta["dirty_at_session_start"] == ["calc.py"]
    assert any("began on uncommitted changes to calc.py" in line and s.sid in line for line in lines)


def test_a_commit_made_right_after_the_episode_is_recorded(tmp_path):
    repo = tmp_path / "repo"
    make_repo(repo)
    fix_session(repo).save(tmp_path / "logs")
    fixed = commit(repo, {"calc.py": CALC_OK}, "fix sub")
    commit(repo, {"other.txt": "x"}, "unrelated")
    t = now().timestamp()
    set_reflog_times(repo, [t - 100, t + 60, t + 70])  # HEAD moved after the session
    rep = mine_tasks([tmp_path / "logs"], tmp_path / "T", options=Options(timeout_s=8.0), sandbox="bwrap",
                     log=lambda _: None)  # fmt: skip
    (ep,) = rep["sessions"][0]["episodes"]
    meta = tomllib.loads((tmp_path / "T" / ep["task"] / "task.toml").read_text())["metadata"]
    assert meta["matching_commit"] == fixed and meta["commit"] != fixed
