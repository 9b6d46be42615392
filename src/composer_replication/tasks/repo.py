"""The git side of mining: where a session's repository is, which commit it started from, its files then.

Only git plumbing runs here (``rev-parse``, ``log``, ``ls-tree``, ``cat-file``), never a command that
reads the working tree (``status``, ``diff``), with hooks and ``core.fsmonitor`` turned off, so a hostile
repository configuration cannot run a program on the host. Files are read from git's objects at the
starting commit, not from the working tree: a symlink is a blob holding its target; one whose target
leaves the repository is never followed and is listed in ``Snapshot.left_out``.
"""

from __future__ import annotations

import datetime as _dt
import os
import posixpath
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

GIT_TIMEOUT_S = 60.0
MAX_FILE_BYTES = 1_000_000
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "GIT_PAGER": "cat", "LC_ALL": "C"}


class GitError(RuntimeError):
    """A git command failed (the message holds its first line of stderr)."""


def git(repo: str | Path, *args: str, input: bytes | None = None) -> bytes:
    """Run ``git -C repo ARGS`` (hooks and fsmonitor off) and return stdout; `GitError` on failure."""
    argv = ["git", "-C", str(repo), "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null"]
    try:
        r = subprocess.run(
            [*argv, *args], input=input, capture_output=True, timeout=GIT_TIMEOUT_S,
            env={**os.environ, **_GIT_ENV},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise GitError(f"git {args[0]}: {e}") from None
    if r.returncode != 0:
        msg = r.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"git {args[0]}: {msg[0] if msg else f'exit {r.returncode}'}")
    return r.stdout


def parse_repo_map(entries: list[str] | None) -> list[tuple[str, str]]:
    """``["OLD=NEW", ...]`` -> ``[(OLD, NEW)]``, longest OLD first; ``ValueError`` naming a bad entry."""
    out = []
    for e in entries or []:
        old, sep, new = e.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise ValueError(
                f"--repo-map {e!r}: expected OLD=NEW (a recorded path prefix and where it is now)"
            )
        out.append((old.rstrip("/") or "/", new.rstrip("/") or "/"))
    return sorted(out, key=lambda p: -len(p[0]))


def map_path(path: str, repo_map: list[tuple[str, str]]) -> str:
    """``path`` with the first matching OLD prefix (whole path components) replaced by NEW."""
    for old, new in repo_map:
        if path == old or path.startswith(old.rstrip("/") + "/"):
            return new + path[len(old) :]
    return path


@dataclass
class RepoLocation:
    top: str  # the repository's top level on this machine (as git reports it)
    recorded_top: str  # the same directory as the session recorded it (before --repo-map)
    subdir: str  # the session's working directory relative to the top ("" at the top)


def locate(cwd: str, repo_map: list[tuple[str, str]]) -> RepoLocation | str:
    """Where the repository of a session run in ``cwd`` is now, or the reason it cannot be found."""
    if not cwd or not cwd.startswith("/"):
        return "no repository: the session records no absolute working directory"
    here = map_path(cwd, repo_map)
    if not os.path.isdir(here):
        moved = f" (mapped from {cwd})" if here != cwd else ""
        return (
            f"no repository: {here}{moved} is not on this machine; if the checkout moved, pass "
            f"--repo-map {cwd}=NEW_PATH"
        )
    try:
        top = git(here, "rev-parse", "--show-toplevel").decode().strip()
    except GitError as e:
        return f"no repository: {here} is not inside a git repository ({e})"
    sub = os.path.relpath(os.path.realpath(here), os.path.realpath(top))
    sub = "" if sub == "." else sub
    recorded = cwd
    if sub:
        parts = sub.split("/")
        recorded = cwd.rstrip("/").rsplit("/", len(parts))[0] or "/"
    return RepoLocation(top=top, recorded_top=recorded, subdir=sub)


def _unix(ts: str) -> int:
    d = _dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return int((d if d.tzinfo else d.replace(tzinfo=_dt.UTC)).timestamp())


def head_at(repo: str, ts: str, branch: str = "") -> tuple[str, str] | str:
    """The commit HEAD pointed at when ``ts`` (ISO time) began, and how it was found; else a reason.

    The reflog says where HEAD moved and when; the newest entry at or before ``ts`` wins. Without one
    (reflog expired, repository cloned again), the last commit of ``branch`` (else HEAD) whose committer
    date is at or before ``ts``.
    """
    try:
        when = _unix(ts)
    except ValueError:
        return f"commit not found: the episode has no usable timestamp ({ts!r})"
    try:
        log = git(repo, "log", "-g", "--format=%H %gd", "--date=unix", "HEAD").decode()
    except GitError:
        log = ""
    for line in log.splitlines():  # newest first
        sha, _, sel = line.partition(" ")
        try:
            t = int(sel[sel.index("{") + 1 : sel.index("}")])
        except ValueError:
            continue
        if t <= when:
            return sha, "reflog"
    for ref in ([f"refs/heads/{branch}", f"refs/remotes/origin/{branch}"] if branch else []) + ["HEAD"]:
        try:
            out = git(repo, "rev-list", "-1", f"--before=@{when}", ref, "--").decode().strip()
        except GitError:
            continue
        if out:
            return out, f"last commit of {ref.removeprefix('refs/heads/')} at or before the episode"
    return (
        f"commit not found: no commit of {branch or 'HEAD'} at or before {ts} in {repo} (reflog expired "
        "and the history starts later, or the branch is gone)"
    )


@dataclass
class Snapshot:
    """The files of a commit: path -> bytes (text and binary), symlinks kept inside, what was left out."""

    commit: str
    files: dict[str, bytes] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)  # path -> target, every one in the tree
    left_out: list[str] = field(default_factory=list)


class TooLarge(ValueError):
    """A commit with more files or bytes than a task may hold (nothing of it was read)."""


def snapshot(
    repo: str, commit: str, *, max_file_bytes: int = MAX_FILE_BYTES, max_files: int = 0, max_bytes: int = 0
) -> Snapshot:
    """Every blob of ``commit`` (symlinks as their targets' contents when those stay inside the tree).

    `TooLarge` before any blob is read when the tree holds more than ``max_files`` files or
    ``max_bytes`` bytes (0 = no limit)."""
    listing = git(repo, "ls-tree", "-r", "-z", "--full-tree", "-l", commit).split(b"\0")
    snap = Snapshot(commit)
    blobs: list[tuple[str, str]] = []
    sizes: list[str] = []
    for entry in filter(None, listing):
        meta, _, raw = entry.partition(b"\t")
        mode, kind, sha, size = meta.decode().split()
        path = raw.decode("utf-8", "surrogateescape")
        if kind != "blob":
            snap.left_out.append(f"{path}: a submodule (not part of the task)")
        elif size != "-" and int(size) > max_file_bytes:
            snap.left_out.append(f"{path}: {size} bytes, over {max_file_bytes}")
        else:
            blobs.append((path, sha))
            sizes.append(size if size != "-" else "0")
            if mode == "120000":
                snap.symlinks[path] = ""
    total = sum(int(size) for size in sizes)
    if (max_files and len(blobs) > max_files) or (max_bytes and total > max_bytes):
        raise TooLarge(f"{len(blobs)} files of {total} bytes at {commit[:12]} (a task holds at most {max_files} "
                       f"files and {max_bytes} bytes)")  # fmt: skip
    data = _cat_blobs(repo, [sha for _, sha in blobs])
    for path, sha in blobs:
        if path in snap.symlinks:
            snap.symlinks[path] = data[sha].decode("utf-8", "surrogateescape")
        else:
            snap.files[path] = data[sha]
    for link, target in snap.symlinks.items():
        inside = resolve_inside(link, snap.symlinks)
        if inside is None:
            snap.left_out.append(f"{link}: a symlink to {target!r}, outside the repository (never followed)")
        elif inside in snap.files:
            snap.files[link] = snap.files[inside]
        else:
            snap.left_out.append(f"{link}: a symlink to a directory or a missing file ({target!r})")
    return snap


def _cat_blobs(repo: str, shas: list[str]) -> dict[str, bytes]:
    out = git(repo, "cat-file", "--batch", input="".join(f"{s}\n" for s in dict.fromkeys(shas)).encode())
    blobs: dict[str, bytes] = {}
    i = 0
    while i < len(out):
        nl = out.index(b"\n", i)
        sha, _kind, size = out[i:nl].decode().split()
        n = int(size)
        blobs[sha] = out[nl + 1 : nl + 1 + n]
        i = nl + 1 + n + 1
    return blobs


def resolve_inside(path: str, symlinks: dict[str, str], depth: int = 0) -> str | None:
    """``path`` (repository-relative) with every symlink component resolved; None if it leaves the tree."""
    if depth > 40:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    for i, part in enumerate(parts):
        if part == "..":
            if not done:
                return None
            done.pop()
            continue
        cur = "/".join([*done, part])
        if cur in symlinks:
            target = symlinks[cur]
            if target.startswith("/"):
                return None
            rest = "/".join(parts[i + 1 :])
            joined = posixpath.join(posixpath.dirname(cur), target, rest)
            return resolve_inside(joined, symlinks, depth + 1)
        done.append(part)
    return "/".join(done) if done else None


def commits_touching(repo: str, start: str, until_ts: str, paths: list[str]) -> list[str]:
    """Commits after ``start`` and at most 30 minutes after ``until_ts`` that touch one of ``paths``
    (oldest first); the matching commit of an episode is the first of these."""
    if not paths:
        return []
    try:
        limit = _unix(until_ts) + 1800
        out = git(
            repo,
            "log",
            "--all",
            "--reverse",
            "--format=%H %ct",
            f"--until=@{limit}",
            f"{start}..",
            "--",
            *paths,
        ).decode()
    except (GitError, ValueError):
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]
