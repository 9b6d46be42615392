"""Hostile task directories and repositories: nothing outside the task root is ever read (real symlinks, FIFOs)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from composer_replication.datagen.tasks import Task, TaskFileError, load_task, load_tasks

API_KEY = "sk-or-v1-adversarial-0123456789abcdef"


def _task_dir(root: Path, name: str = "t") -> Path:
    d = root / name
    (d / "files").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "task.json").write_text(json.dumps({"name": name, "instruction": "fix it", "test_command": "true"}))
    (d / "files" / "main.py").write_text("print(1)\n")
    return d


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


@pytest.mark.parametrize(
    "where, target",
    [
        ("files/passwd", "/etc/passwd"),
        ("files/env", "/proc/self/environ"),
        ("solution/main.py", "/etc/passwd"),
        ("files/deep/er/x", "/etc/hostname"),
        ("files/rel", "../../../../../../../../etc/passwd"),
    ],
)
def test_symlink_leaving_the_task_is_refused(tmp_path, monkeypatch, where, target):
    monkeypatch.setenv("CR_TEST_OPENROUTER_API_KEY", API_KEY)  # what /proc/self/environ would carry
    d = _task_dir(tmp_path)
    link = d / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    with pytest.raises(TaskFileError, match="outside the task root") as e:
        load_task(d)
    assert where in str(e.value) and API_KEY not in str(e.value)


def test_symlinked_directories_leaving_the_task_are_refused(tmp_path):
    d = _task_dir(tmp_path)
    (d / "files" / "etc").symlink_to("/etc")
    with pytest.raises(TaskFileError, match="outside the task root"):
        load_task(d)
    d2 = tmp_path / "t2"
    d2.mkdir()
    (d2 / "task.json").write_text(json.dumps({"name": "t2", "instruction": "x", "test_command": "true"}))
    (d2 / "files").symlink_to("/etc")
    with pytest.raises(TaskFileError, match="outside the task root"):
        load_task(d2)


def test_task_json_symlink_leaving_the_task_is_refused(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"name": "o", "instruction": "x", "test_command": "true"}))
    d = tmp_path / "t"
    d.mkdir()
    (d / "task.json").symlink_to(outside)
    with pytest.raises(TaskFileError, match="task.json"):
        load_task(d)


def test_task_directory_symlink_leaving_the_tasks_root_is_refused(tmp_path):
    elsewhere = _task_dir(tmp_path / "elsewhere", "evil")
    root = tmp_path / "tasks"
    _task_dir(root, "good")
    (root / "evil").symlink_to(elsewhere)
    with pytest.raises(TaskFileError, match="outside the tasks root"):
        load_tasks(root)


def test_symlinks_inside_the_task_are_read_from_inside(tmp_path):
    d = _task_dir(tmp_path)
    (d / "solution" / "main.py").write_text("print(2)\n")
    (d / "files" / "alias.py").symlink_to("main.py")
    (d / "files" / "sol.py").symlink_to("../solution/main.py")
    t = load_task(d)
    assert t.files == {"main.py": "print(1)\n", "alias.py": "print(1)\n", "sol.py": "print(2)\n"}


def test_symlink_loops_and_fifos_are_named_errors_not_hangs(tmp_path):
    d = _task_dir(tmp_path)
    (d / "files" / "loop").symlink_to("loop")
    with pytest.raises(TaskFileError, match="loop"):
        load_task(d)
    (d / "files" / "loop").unlink()
    os.mkfifo(d / "files" / "pipe")
    done: list[BaseException] = []

    def load() -> None:
        try:
            load_task(d)
        except BaseException as e:  # noqa: BLE001 - handed back to the test thread
            done.append(e)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(10)
    assert done, "load_task blocked on a FIFO"
    assert isinstance(done[0], TaskFileError) and "not a regular file" in str(done[0])


def test_from_repo_refuses_tracked_symlinks_leaving_the_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("CR_TEST_OPENROUTER_API_KEY", API_KEY)
    for target in ("/etc/passwd", "/proc/self/environ", "../outside.txt"):
        (tmp_path / "outside.txt").write_text("host file\n")
        repo = tmp_path / f"repo{abs(hash(target))}"
        repo.mkdir()
        _git(repo, "init", "-q")
        (repo / "a.py").write_text("A = 1\n")
        (repo / "leak").symlink_to(target)
        _git(repo, "add", "a.py", "leak")
        _git(repo, "commit", "-qm", "x")
        with pytest.raises(TaskFileError, match="leak") as e:
            Task.from_repo(repo, name="r", instruction="do", test_command="true")
        assert API_KEY not in str(e.value) and "root:" not in str(e.value)


def test_from_repo_refuses_a_tracked_path_whose_directory_became_a_symlink(tmp_path):
    repo = tmp_path / "repo"
    (repo / "conf").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "conf" / "passwd").write_text("safe\n")
    _git(repo, "add", "conf/passwd")
    _git(repo, "commit", "-qm", "x")
    (repo / "conf" / "passwd").unlink()
    (repo / "conf").rmdir()
    (repo / "conf").symlink_to("/etc")  # the index still lists conf/passwd
    with pytest.raises(TaskFileError, match="outside the task root"):
        Task.from_repo(repo, name="r", instruction="do", test_command="true")


def test_from_repo_keeps_inside_symlinks_and_skips_directory_links(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "pkg" / "mod.py").write_text("X = 1\n")
    (repo / "alias.py").symlink_to("pkg/mod.py")
    (repo / "pkglink").symlink_to("pkg")
    _git(repo, "add", "pkg/mod.py", "alias.py", "pkglink")
    _git(repo, "commit", "-qm", "x")
    t = Task.from_repo(repo, name="r", instruction="do", test_command="true")
    assert t.files == {"pkg/mod.py": "X = 1\n", "alias.py": "X = 1\n"}
