"""Test commands recognised in shell calls, and sessions cut into episodes (from real-format logs)."""

from __future__ import annotations

import pytest
from _mining import ClaudeSession, CodexSession

from composer_replication.tasks.checks import find_checks, shell_command
from composer_replication.tasks.episodes import episodes, turns
from composer_replication.tasks.sessions import read_sessions

PY = "python3 -m pytest -q -p no:cacheprovider"


@pytest.mark.parametrize(
    "cmd, sub, want",
    [
        (
            "cd /r/sub && uv run pytest tests/test_a.py -x -q 2>&1 | tail -20",
            "",
            f"cd sub && {PY} tests/test_a.py",
        ),
        ('python -m pytest -k "add and not slow" --tb short t.py', "", f"{PY} -k 'add and not slow' t.py"),
        ("FOO=1 timeout 60 pytest", "", PY),
        ("pytest a.py::test_x", "pkg", f"cd pkg && {PY} a.py::test_x"),
        ("pytest /r/test/t.py::T::test_a", "", f"{PY} test/t.py::T::test_a"),
        ("cd /r/test && pytest /r/test/t.py", "", f"cd test && {PY} t.py"),
        ("python3 -m unittest tests.test_x -v", "", "python3 -m unittest tests.test_x"),
        ("npm run test -- --watch=false", "", "npm test -- --watch=false"),
        ("pnpm test", "", "pnpm test"),
        ("go test ./pkg/... -run TestX -v", "", "go test ./pkg/... -run TestX"),
        ("cargo test parse -- --nocapture", "", "cargo test --offline parse"),
        ("make test", "", "make test"),
        ("mix test --seed 0 test/a_test.exs 2>&1 | head", "", "mix test test/a_test.exs"),
    ],
)
def test_runners_are_recognised_and_narrowed(cmd, sub, want):
    assert [c.command for c in find_checks(cmd, sub, ("/r",))] == [want]


@pytest.mark.parametrize(
    "cmd",
    ["echo pytest", 'git commit -m "run pytest"', "cd /elsewhere && pytest", "cd .. && pytest", "ls tests"],
)
def test_non_test_commands_and_runs_outside_the_repository_are_not_checks(cmd):
    assert find_checks(cmd, "", ("/r",)) == []


def test_shell_inputs_of_both_formats():
    assert shell_command("Bash", {"command": "pytest -q"}) == ("pytest -q", "")
    assert shell_command("shell", {"command": ["bash", "-lc", "pytest"], "workdir": "/r"}) == ("pytest", "/r")
    assert shell_command("exec_command", {"cmd": "go test", "workdir": "/r"}) == ("go test", "/r")
    assert shell_command("Read", {"file_path": "x"}) is None


def test_claude_session_episodes_preamble_interrupt_and_trailing_tests(tmp_path):
    s = ClaudeSession("/r")
    s.user("what does sub do?").say("It adds.")
    s.user("fix it").bash("pytest -q", "1 failed", exit_code=1)
    s.edit("/r/calc.py", "a + b", "a - b").interrupt()
    s.user("no, keep add; only sub").edit("/r/calc.py", "x", "y")
    s.user("run the tests").bash("pytest -q", "2 passed")
    s.user("now add mul").write("/r/mul.py", "def mul(a, b):\n    return a * b\n")
    s.user("thanks, bye")
    s.edit("/r/calc.py", "zzz", "q", ok=False)  # a failed edit is no change
    logs, _ = read_sessions([s.save(tmp_path)])
    eps = episodes(turns(logs[0].conversation, "/r"))
    assert [e.turn_range for e in eps] == [(1, 3), (5, 5)]  # turn 4 tested episode 1: not a preamble
    assert eps[0].messages == ["what does sub do?", "fix it", "no, keep add; only sub"]
    assert [op.tool for op in eps[0].ops] == ["Edit", "Edit"]
    assert [c for c, _ in eps[0].commands] == ["pytest -q", "pytest -q"]  # the trailing turn's run counts
    assert eps[1].messages == ["now add mul"] and eps[1].trailing[0].text == "thanks, bye"
    assert eps[0].start_ts < eps[1].start_ts


def test_codex_rollout_episodes_use_apply_patch_and_shell_runs(tmp_path):
    s = CodexSession("/r")
    s.user("make sub subtract").shell("pytest -q", "1 failed", exit_code=1)
    s.apply_patch("*** Update File: calc.py\n@@\n-    return a + b\n+    return a - b")
    s.apply_patch("*** Update File: nope.py\n@@\n-a\n+b", ok=False)
    s.shell("pytest -q", "2 passed")
    logs, _ = read_sessions([s.save(tmp_path)])
    assert logs[0].source == "codex" and logs[0].cwd == "/r"
    (ep,) = episodes(turns(logs[0].conversation, "/r"))
    assert [op.tool for op in ep.ops] == ["apply_patch"]
    assert [c for c, _ in ep.commands] == ["pytest -q", "pytest -q"]
    assert ep.start_ts


def test_session_filters_are_the_ingest_ones(tmp_path):
    a = ClaudeSession("/r/alpha").user("x").save(tmp_path)
    ClaudeSession("/r/beta").user("y").save(tmp_path)
    logs, _ = read_sessions([tmp_path], project="alpha")
    assert [log.path for log in logs] == [a]
    assert read_sessions([tmp_path], until="2000-01-01")[0] == []
