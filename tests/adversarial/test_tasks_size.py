"""Hostile task sizes: too many files, too many bytes (a sparse 40 GB file among them), in a task
directory and in a repository snapshot. Each is refused in one line naming the task and the limit,
before an oversized file is read; a task just under the limits loads."""

from __future__ import annotations

import json
import subprocess

import pytest

from composer_replication.datagen import tasks as tasks_mod
from composer_replication.datagen.tasks import MAX_TASK_BYTES, MAX_TASK_FILES, Task, load_task


def _task_dir(root, name="big"):
    d = root / name
    (d / "files").mkdir(parents=True)
    (d / "task.json").write_text(json.dumps({"name": name, "instruction": "i", "test_command": "true"}))
    return d


def test_the_limits_are_sane():
    assert MAX_TASK_FILES == 10_000 and MAX_TASK_BYTES == 32 * 1024 * 1024


def test_too_many_files_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(tasks_mod, "MAX_TASK_FILES", 50)  # the real limit, scaled down to keep this fast
    d = _task_dir(tmp_path)
    for i in range(40):
        (d / "files" / f"f{i}.py").write_text("x = 1\n")
    assert len(load_task(d).files) == 40
    (d / "solution").mkdir()
    for i in range(11):  # files/ and solution/ count together
        (d / "solution" / f"s{i}.py").write_text("x = 2\n")
    with pytest.raises(ValueError) as e:
        load_task(d)
    msg = str(e.value)
    assert "\n" not in msg and "task 'big'" in msg and "more than 50 files" in msg and "MAX_TASK_FILES" in msg


def test_a_huge_file_is_refused_before_it_is_read(tmp_path):
    d = _task_dir(tmp_path)
    (d / "files" / "ok.py").write_text("x = 1\n")
    with open(d / "files" / "huge.bin", "wb") as f:
        f.truncate(40 * 1024**3)  # sparse: 40 GB that reading would take minutes and all the memory
    with pytest.raises(ValueError, match=r"task 'big' .*more than 33554432 bytes .*MAX_TASK_BYTES"):
        load_task(d)


def test_bytes_add_up_across_files(tmp_path):
    d = _task_dir(tmp_path)
    chunk = "x" * (MAX_TASK_BYTES // 4)
    for i in range(4):
        (d / "files" / f"part{i}.txt").write_text(chunk)
    assert len(load_task(d).files) == 4  # exactly at the limit
    (d / "files" / "one_more.txt").write_text("y")
    with pytest.raises(ValueError, match="MAX_TASK_BYTES"):
        load_task(d)


def test_repository_snapshots_are_capped_too(tmp_path, monkeypatch):
    monkeypatch.setattr(tasks_mod, "MAX_TASK_FILES", 5)
    repo = tmp_path / "repo"
    repo.mkdir()
    for i in range(6):
        (repo / f"m{i}.py").write_text(f"X = {i}\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    with pytest.raises(ValueError, match=r"task 'snap' \(repository .*more than 5 files"):
        Task.from_repo(repo, name="snap", instruction="i", test_command="true")
