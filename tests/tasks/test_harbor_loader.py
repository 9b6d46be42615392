"""The project's task loader reads the Harbor layout mined tasks use, and still reads the task.json one."""

from __future__ import annotations

import tomllib

import pytest

from composer_replication.datagen import harbor
from composer_replication.datagen.tasks import bundled_tasks, load_task, load_tasks
from composer_replication.tasks.layout import TaskDraft, is_test_path, publish, write_task


def draft(name="mined-1", **kw):
    base = dict(
        name=name, instruction="Fix sub: it adds.\n\nAlso keep add.", files={"calc.py": "old\n", "pkg/m.py": "m\n"},
        test_files={"tests/test_calc.py": "def test(): pass\n"}, solution={"calc.py": "new\n"}, deleted=["pkg/m.py"],
        checks=["python3 -m pytest -q tests", "make test"], timeout_s=30.0,
        metadata={"source": "claude_code", "session_id": "s-1", "turns": [2, 3], "commit": "abc",
                  "note": 'quote " backslash \\ and DEL \x7f'},
        environment={"kind": "python", "packages": [], "install": []},
    )  # fmt: skip
    base.update(kw)
    return TaskDraft(**base)


def test_mined_task_folder_round_trips_through_the_loader(tmp_path):
    d = draft()
    publish(write_task(tmp_path, d), tmp_path / d.name)
    task = load_task(tmp_path / d.name)
    assert task.name == "mined-1" and task.instruction.startswith("Fix sub")
    assert task.files == {"calc.py": "old\n", "pkg/m.py": "m\n", "tests/test_calc.py": "def test(): pass\n"}
    assert task.solution == {"calc.py": "new\n"} and task.timeout_s == 30.0
    assert "python3 -m pytest -q tests" in task.test_command and "make test" in task.test_command
    meta = tomllib.loads((tmp_path / d.name / "task.toml").read_text())
    assert meta["metadata"]["note"] == d.metadata["note"] and meta["solution"]["deleted"] == ["pkg/m.py"]
    patch = (tmp_path / d.name / "solution" / "patch.diff").read_text()
    assert "--- a/calc.py" in patch and "+++ /dev/null" in patch and "+++ b/tests/test_calc.py" in patch
    assert (tmp_path / d.name / "tests" / "test.sh").stat().st_mode & 0o111


def test_load_tasks_reads_both_layouts_side_by_side(tmp_path):
    publish(write_task(tmp_path, draft("a-mined")), tmp_path / "a-mined")
    old = tmp_path / "b-old"
    (old / "files").mkdir(parents=True)
    (old / "task.json").write_text('{"name": "b-old", "instruction": "x", "test_command": "true"}')
    (old / "files" / "f.py").write_text("1\n")
    assert [t.name for t in load_tasks(tmp_path)] == ["a-mined", "b-old"]
    assert set(bundled_tasks()) >= {"fizzbuzz", "off_by_one"}


@pytest.mark.parametrize(
    "toml, match",
    [
        ("[verifier\n", "not valid TOML"),
        ('[metadata]\nname = "x"\n', "checks must be a non-empty list"),
        ('[verifier]\nchecks = ["true", 3]\n', "checks must be a non-empty list"),
        ('[verifier]\nchecks = ["true"]\ntimeout_sec = -1\n', "timeout_sec"),
        ('[metadata]\nname = "../up"\n[verifier]\nchecks = ["true"]\n', "name"),
        ('metadata = 3\n[verifier]\nchecks = ["true"]\n', r"\[metadata\] must be a table"),
    ],
)
def test_a_hand_edited_task_toml_fails_with_one_line_naming_file_and_field(tmp_path, toml, match):
    d = tmp_path / "t"
    d.mkdir()
    (d / "task.toml").write_text(toml)
    (d / "instruction.md").write_text("do it\n")
    with pytest.raises(ValueError, match=match) as e:
        load_task(d)
    assert str(d / "task.toml") in str(e.value) and "\n" not in str(e.value)


def test_missing_or_empty_instruction_is_named(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    (d / "task.toml").write_text('[verifier]\nchecks = ["true"]\n')
    with pytest.raises(FileNotFoundError, match="instruction.md"):
        load_task(d)
    (d / "instruction.md").write_text("  \n")
    with pytest.raises(ValueError, match="instruction.md: empty"):
        load_task(d)


def test_joined_command_runs_every_check_and_fails_if_any_fails(tmp_path):
    import subprocess

    ok = subprocess.run(["bash", "-c", harbor.joined_command(["true", "true"])])
    bad = subprocess.run(["bash", "-c", harbor.joined_command(["false", f"touch {tmp_path}/ran"])])
    assert ok.returncode == 0 and bad.returncode == 1 and (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "path, test",
    [("tests/x.py", True), ("pkg/test_a.py", True), ("a_test.go", True), ("src/app.test.tsx", True),
     ("conftest.py", True), ("calc.py", False), ("testing_utils.py", False), ("latest/x.py", False)],
)  # fmt: skip
def test_test_paths(path, test):
    assert is_test_path(path) is test
