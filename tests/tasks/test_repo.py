"""The git side of mining, on real repositories: location, starting commit, snapshot."""

from __future__ import annotations

import os

import pytest
from _mining import commit, git, iso, make_repo, now, set_reflog_times

from composer_replication.tasks.repo import TooLarge, head_at, locate, map_path, parse_repo_map, snapshot
from composer_replication.tasks.repo import git as run_git


def test_head_at_follows_the_reflog(tmp_path):
    repo = tmp_path / "r"
    first = make_repo(repo)
    second = commit(repo, {"a.txt": "2"})
    t0 = now(-1000).timestamp()
    set_reflog_times(repo, [t0, t0 + 500])
    assert head_at(str(repo), iso(now(-800)), "main") == (first, "reflog")
    assert head_at(str(repo), iso(now(-100)), "main") == (second, "reflog")


def test_head_at_falls_back_to_commit_dates_without_a_reflog(tmp_path):
    repo = tmp_path / "r"
    first = make_repo(repo, date="2024-01-01T00:00:00Z")
    commit(repo, {"a.txt": "2"}, date="2024-06-01T00:00:00Z")
    git(repo, "reflog", "expire", "--expire=now", "--all")
    sha, how = head_at(str(repo), "2024-03-01T00:00:00Z", "main")
    assert sha == first and "at or before" in how
    assert "commit not found" in head_at(str(repo), "2023-01-01T00:00:00Z", "main")
    assert "commit not found" in head_at(str(repo), "not a time", "main")


def test_locate_top_subdir_and_repo_map(tmp_path):
    repo = tmp_path / "now" / "proj"
    make_repo(repo)
    (repo / "sub").mkdir()
    loc = locate(str(repo / "sub"), [])
    assert (loc.top, loc.subdir, loc.recorded_top) == (str(repo), "sub", str(repo))
    moved = locate("/home/someone/proj/sub", parse_repo_map([f"/home/someone={tmp_path / 'now'}"]))
    assert moved.top == str(repo) and moved.recorded_top == "/home/someone/proj"
    gone = locate("/home/someone/proj", [])
    assert gone.startswith("no repository") and "--repo-map /home/someone/proj=NEW_PATH" in gone
    plain = tmp_path / "plain"
    plain.mkdir()
    assert "not inside a git repository" in locate(str(plain), [])
    assert map_path("/a/bc", [("/a/b", "/x")]) == "/a/bc"  # whole path components only


def test_snapshot_reads_objects_not_the_working_tree_and_never_follows_links_out(tmp_path):
    repo = tmp_path / "r"
    make_repo(repo, {"a.py": "A\n", "d/b.py": "B\n"})
    os.symlink("d/b.py", repo / "inside")
    os.symlink("/etc/passwd", repo / "outside")
    os.symlink("../../secret", repo / "relative_out")
    sha = commit(repo, {})
    (repo / "a.py").write_text("uncommitted\n")
    snap = snapshot(str(repo), sha)
    assert snap.files["a.py"] == b"A\n" and snap.files["inside"] == b"B\n"
    assert "outside" not in snap.files and "relative_out" not in snap.files
    assert any(x.startswith("outside: a symlink to '/etc/passwd'") for x in snap.left_out)
    assert snap.symlinks["outside"] == "/etc/passwd"


def test_git_never_runs_the_repositorys_fsmonitor_or_hooks(tmp_path):
    repo = tmp_path / "r"
    sha = make_repo(repo)
    canary = tmp_path / "ran"
    git(repo, "config", "core.fsmonitor", f"touch {canary}; false")
    git(repo, "config", "core.hooksPath", str(tmp_path))
    snapshot(str(repo), sha)
    head_at(str(repo), iso(now(60)), "main")
    locate(str(repo), [])
    run_git(str(repo), "status")  # even a command that reads the working tree, through the helper
    assert not canary.exists()
    git(repo, "status")  # the control: plain git runs the configured program
    assert canary.exists()


def test_a_tree_too_big_for_a_task_is_refused_before_it_is_read(tmp_path):
    repo = tmp_path / "r"
    sha = make_repo(repo, {"a.txt": "x" * 100, "b.txt": "y"})
    with pytest.raises(TooLarge, match="2 files of 101 bytes"):
        snapshot(str(repo), sha, max_files=1)
    with pytest.raises(TooLarge):
        snapshot(str(repo), sha, max_bytes=50)
    assert len(snapshot(str(repo), sha, max_files=2, max_bytes=101).files) == 2
