"""Task names and rollout ids become file names: traversal and separators are refused, outputs stay inside."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from composer_replication.datagen.rollout import ScriptedPolicy, run_rollout, run_rollouts
from composer_replication.datagen.tasks import Task, check_name, load_task, path_inside

BAD_NAMES = [
    "../../../x",
    "..",
    ".",
    "",
    "a/b",
    "/abs",
    "a\\b",
    "x..y",
    ".hidden",
    "-rf",
    "a b",
    "nul\x00byte",
    "new\nline",
    "x" * 200,
    "ünïcode",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_task_names_are_refused(name):
    with pytest.raises(ValueError, match="not allowed"):
        Task(name=name, instruction="i", test_command="true")
    with pytest.raises(ValueError, match="not allowed"):
        check_name(name)


@pytest.mark.parametrize("name", ["off_by_one", "fix-import", "T1", "a.b_c-d", "x" * 128])
def test_good_task_names_pass(name):
    assert Task(name=name, instruction="i", test_command="true").name == name


def test_task_json_name_traversal_names_the_file_and_field(tmp_path):
    (tmp_path / "files").mkdir()
    (tmp_path / "task.json").write_text(
        json.dumps({"name": "../../../x", "instruction": "i", "test_command": "true"})
    )
    with pytest.raises(ValueError, match=r"task.json: field 'name'"):
        load_task(tmp_path)


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_rollout_id_traversal_writes_nothing_outside(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    out.mkdir(parents=True)
    task = Task(name="ok", instruction="i", test_command="true")
    for rid in ("../../../escaped", "../escaped", "/tmp/escaped", "sub/escaped"):
        with pytest.raises(ValueError, match="rollout id"):
            run_rollout(task, ScriptedPolicy([]), rollout_id=rid, log_dir=out)
    assert _tree(tmp_path) == ["a", "a/b", "a/b/out"]


def test_a_name_changed_after_validation_is_caught_before_any_write(tmp_path):
    task = Task(name="ok", instruction="i", test_command="true")
    task.name = "../../../pwned"  # a dataclass is mutable: the output path is checked again
    out = tmp_path / "deep" / "out"
    with pytest.raises(ValueError, match="not allowed"):
        run_rollouts([task], lambda t: ScriptedPolicy([]), out, progress=False)
    assert not any(p.name.startswith("pwned") for p in tmp_path.rglob("*"))


def test_path_inside_stays_inside(tmp_path):
    assert path_inside(tmp_path, "r-001", ".jsonl") == tmp_path / "r-001.jsonl"
    for bad in ("../x", "x/../../y", ".."):
        with pytest.raises(ValueError):
            path_inside(tmp_path, bad, ".jsonl")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_a_good_rollout_writes_its_log_inside_the_directory(tmp_path):
    task = Task(name="ok", instruction="i", test_command="true")
    r = run_rollout(task, ScriptedPolicy([]), rollout_id="ok-000", log_dir=tmp_path / "sessions")
    assert Path(r.session_log).resolve().parent == (tmp_path / "sessions").resolve()


@pytest.mark.parametrize(
    "call",
    ["Bash", {"name": "Bash"}, {"name": "", "arguments": {}}, {"name": "Bash", "arguments": "ls"},
     {"name": "Bash", "arguments": {}, "extra": 1}],
)
def test_a_malformed_example_call_names_the_file_and_the_shape(tmp_path, call):
    (tmp_path / "files").mkdir()
    (tmp_path / "task.json").write_text(
        json.dumps({"name": "t", "instruction": "i", "test_command": "true", "example_call": call})
    )
    with pytest.raises(ValueError, match=r"task\.json.*example_call must be"):
        load_task(tmp_path)
