"""The verifier (datagen.verifier): which changes it applies, how it reads pytest's outcomes, and its
verdicts on the bundled tasks in a real sandbox. The hostile probes are in
tests/adversarial/test_reward_hacks.py."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from composer_replication.datagen.checks import judge
from composer_replication.datagen.protected import cache_source, is_protected, split_changes
from composer_replication.datagen.sandbox import make_sandbox
from composer_replication.datagen.tasks import Task, bundled_tasks
from composer_replication.datagen.verifier import (
    Verdict,
    solution_changes,
    verify,
    verify_changes,
)
from composer_replication.datagen.workspace import read_changes
from composer_replication.safety import KillSwitchTriggered

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def _task(**kw) -> Task:
    files = {"calc.py": "def add(a, b):\n    return a - b\n", "tests/test_calc.py": "x", "pyproject.toml": ""}
    base = dict(name="t", instruction="i", test_command="python3 -m pytest -q tests", files=files)
    return Task(**(base | kw))


def test_task_checks_default_to_the_test_command_and_can_be_listed():
    t = _task()
    assert t.checks == ["python3 -m pytest -q tests"]
    t2 = _task(check_commands=["pytest tests/test_calc.py::test_a", "bash ci/run.sh"])
    assert t2.checks == ["pytest tests/test_calc.py::test_a", "bash ci/run.sh"]
    with pytest.raises(ValueError, match="env names"):
        _task(env={"1BAD": "x"})


def test_protected_paths():
    t = _task(check_commands=["bash ci/run.sh", "make check", "pytest -c=ci/pytest.cfg"])
    protected = [
        "tests/test_calc.py", "tests/data/expected.json", "pkg/test_x.py", "pkg/x_test.py",
        "conftest.py", "deep/er/conftest.py", "pytest.ini", "sub/tox.ini", ".pytest.toml",
        "sitecustomize.py", ".local/lib/python3.11/site-packages/usercustomize.py", "x.pth",
        "pytest.py", "_pytest/runner.py", "pluggy/__init__.py", "ci/run.sh", "Makefile", "ci/pytest.cfg",
    ]  # fmt: skip
    free = ["calc.py", "pkg/util.py", "testing_utils.py", "README.md", "bin/pytest", "pyproject.toml"]
    assert [p for p in protected if not is_protected(t, p)] == []
    assert [p for p in free if is_protected(t, p)] == []
    assert not is_protected(_task(), "Makefile")  # only when a check runs make
    # a runner-named module shadows pytest only where Python imports from: the root, the task's PYTHONPATH
    assert not is_protected(_task(), "src/pytest.py") and not is_protected(_task(), "pkg/py/x.py")
    assert is_protected(_task(env={"PYTHONPATH": "src:/abs"}), "src/pytest.py")
    assert is_protected(_task(env={"PYTHONPATH": "./src"}), "src/_pytest/runner.py")


def test_split_changes_keeps_source_and_refuses_the_rest():
    t = _task(files={"calc.py": "old", "tests/test_calc.py": "t", "pyproject.toml": "[project]\nname='x'\n"})
    split = split_changes(
        t,
        {
            "calc.py": b"new",
            "helper.py": b"h",
            "tests/test_calc.py": b"def test_ok(): pass",
            "tests/conftest.py": b"evil",
            "pyproject.toml": b"[project]\nname='y'\n",  # not a test section: applied
            "sub/pyproject.toml": b"[tool.pytest.ini_options]\naddopts='--co'\n",
            "setup.cfg": b"[tool:pytest]\naddopts = --co\n",
            "__pycache__/calc.cpython-311.pyc": b"x",  # a cache: dropped, not an attempt
            "tests/__pycache__/test_calc.cpython-311-pytest-9.0.3.pyc": b"x",  # for a test: an attempt
            "../escape.py": b"x",
            "README.md": None,  # deleting what never existed is no change
        },
    )
    assert split.kept == {"calc.py": b"new", "helper.py": b"h", "pyproject.toml": b"[project]\nname='y'\n"}
    assert split.touched == [
        "setup.cfg",
        "sub/pyproject.toml",
        "tests/__pycache__/test_calc.cpython-311-pytest-9.0.3.pyc",
        "tests/conftest.py",
        "tests/test_calc.py",
    ]
    assert split.dropped == ["../escape.py", "__pycache__/calc.cpython-311.pyc"]
    # rewriting a test with its own bytes, or deleting a test, and a pyproject's test section
    same = split_changes(t, {"tests/test_calc.py": b"t", "calc.py": None})
    assert same.touched == [] and same.kept == {"calc.py": None}
    t2 = _task(files={"pyproject.toml": "[tool.pytest.ini_options]\naddopts='-q'\n"})
    assert split_changes(t2, {"pyproject.toml": None}).touched == ["pyproject.toml"]
    assert split_changes(t2, {"pyproject.toml": b"not [toml"}).touched == ["pyproject.toml"]
    assert cache_source("a/__pycache__/m.cpython-311-pytest-9.0.3.pyc") == "a/m.py"
    assert cache_source("m.pyc") == "m.py" and cache_source("notes.txt") is None


def _result(output: str = "", rc: int = 0, timed_out: bool = False):
    return SimpleNamespace(output=output, returncode=rc, timed_out=timed_out, ok=rc == 0 and not timed_out)


def _report(*records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def test_judge_reads_the_plugin_report():
    items = {"event": "items", "ids": ["t.py::a", "t.py::b", "t.py::c"], "errors": []}
    tests = [{"event": "test", "id": f"t.py::{x}", "outcome": "passed"} for x in "abc"]
    full = _report({"event": "start"}, items, *tests, {"event": "finish", "exitstatus": 0})
    ok = judge("python3 -m pytest t.py", _result("3 passed"), full)
    assert ok.passed and ok.fraction == 1.0 and ok.tests == dict.fromkeys(items["ids"], "passed")
    # cut short after two tests (os._exit): no finish line, the third never ran
    cut = judge("pytest t.py", _result(rc=0), _report({"event": "start"}, items, *tests[:2]))
    assert not cut.passed and cut.fraction == pytest.approx(2 / 3) and cut.tests["t.py::c"] == "not run"
    # a skip is not a pass; a collection error counts against; a test seen twice keeps its worst outcome
    skip = {"event": "test", "id": "t.py::c", "outcome": "skipped"}
    mixed = _report(
        {"event": "start"},
        {**items, "errors": ["u.py"]},
        *tests[:2],
        skip,
        {"event": "finish", "exitstatus": 0, "errors": ["u.py"]},
        {"event": "start"},
        {"event": "test", "id": "t.py::a", "outcome": "failed"},
        {"event": "finish", "exitstatus": 1},
    )
    m = judge("pytest t.py", _result(rc=1), mixed)
    assert not m.passed and m.fraction == pytest.approx(1 / 4)
    assert m.tests == {"t.py::a": "failed", "t.py::b": "passed", "t.py::c": "skipped",
                       "<collection error: u.py>": "error"}  # fmt: skip
    # pytest that never reported (shadowed, or killed before it started) fails whatever it printed
    fake = judge("python3 -m pytest -q t.py", _result("3 passed in 0.01s"), None)
    assert not fake.passed and fake.fraction == 0.0
    # a plain script is judged by its exit code and summary
    script = judge("python3 test_text.py", _result("5 passed, 2 failed", rc=1), None)
    assert not script.passed and script.fraction == pytest.approx(5 / 7)
    assert judge("python3 test_text.py", _result("ok"), None).passed


def test_verdict_policy():
    from composer_replication.datagen.checks import CheckResult

    checks = [CheckResult("c", True, 1.0, ""), CheckResult("d", False, 0.5, "")]
    v = Verdict("t", checks, ["conftest.py"])
    assert v.hacked and v.tests_fraction == 0.75 and v.tests_score == 0.0 and not v.solved
    r = Verdict("t", checks[:1], ["conftest.py"], on_protected="restore")
    assert r.hacked and r.tests_score == 1.0 and r.solved
    infra = Verdict("t", infra_error="SandboxError: down")
    assert infra.tests_fraction is None and infra.tests_score is None and not infra.solved
    assert infra.to_dict()["tests_score"] is None and v.to_dict()["hacked"] is True
    with pytest.raises(ValueError, match="on_protected"):
        verify_changes(_task(), {}, on_protected="lenient")  # type: ignore[arg-type]


@needs_bwrap
@pytest.mark.parametrize("name", sorted(bundled_tasks()))
def test_bundled_solution_solves_and_the_original_does_not(name):
    task = bundled_tasks()[name]
    good = verify_changes(task, solution_changes(task), sandbox="bwrap")
    assert good.solved and good.tests_score == 1.0 and not good.hacked, good.output
    idle = verify_changes(task, {}, sandbox="bwrap")
    assert not idle.solved and idle.tests_score is not None and idle.tests_score < 1.0


@needs_bwrap
def test_checks_are_scored_one_by_one_in_a_clean_environment():
    task = Task(
        name="multi",
        instruction="i",
        test_command="python3 -m pytest -q test_a.py",
        files={"a.py": "X = 1\n", "test_a.py": "from a import X\n\ndef test_x():\n    assert X == 2\n"},
        check_commands=[
            "python3 -m pytest -q test_a.py",
            'test "$MODE" = strict && test ! -e "$HOME/.bashrc" && python3 -c "import sys; print(sys.flags.no_user_site)"',
        ],
        env={"MODE": "strict"},
    )
    v = verify_changes(task, {"a.py": b"X = 2\n", ".bashrc": b"export MODE=lax\n"}, sandbox="bwrap")
    assert [c.passed for c in v.checks] == [True, True], v.output
    assert v.checks[0].tests == {"test_a.py::test_x": "passed"} and v.checks[1].output_tail.strip() == "1"
    assert verify_changes(task, {}, sandbox="bwrap").checks[0].passed is False
    with pytest.raises(KillSwitchTriggered):
        verify_changes(task, {}, sandbox="bwrap", stop=lambda: "stop file")


@needs_bwrap
def test_verify_reads_the_agent_workspace():
    task = bundled_tasks()["off_by_one"]
    with make_sandbox("bwrap") as sb:
        for path, content in task.files.items():
            sb.put(path, content)
        sb.put("mathx.py", task.solution["mathx.py"])
        r = sb.exec("mkdir notes && echo x > notes/a.txt && ln -s /etc/passwd leak && chmod 000 notes")
        assert r.ok, r.output
        changes, dropped = read_changes(task, sb)
        assert changes == {"mathx.py": task.solution["mathx.py"].encode(), "notes/a.txt": b"x\n"}
        assert dropped == ["leak"]
        v = verify(task, sb, sandbox="bwrap")
    assert v.solved and v.dropped == ["leak"]


def test_infrastructure_failure_is_no_score(tmp_path):
    from composer_replication.datagen.bwrap_sandbox import BwrapSandbox

    task = bundled_tasks()["off_by_one"]
    v = verify_changes(task, solution_changes(task), sandbox=lambda: BwrapSandbox(bwrap=str(tmp_path / "x")))
    assert v.infra_error and "bubblewrap not found" in v.infra_error
    assert v.tests_score is None and not v.solved
