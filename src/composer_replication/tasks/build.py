"""One episode -> a task draft: starting commit, starting files, replayed reference, checks, redaction.

Raises `Dropped` with the report's reason when the episode cannot become a task. Validation (running the
checks) is `tasks.validate`; writing the folder is `tasks.layout`.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from composer_replication.datagen.tasks import MAX_TASK_BYTES, MAX_TASK_FILES
from composer_replication.ingestion.redact import Redactor
from composer_replication.tasks import environment as envmod
from composer_replication.tasks.checks import find_checks
from composer_replication.tasks.edits import ReplayError, replay, repo_path
from composer_replication.tasks.episodes import Episode
from composer_replication.tasks.layout import TaskDraft, is_test_path, safe_component
from composer_replication.tasks.repo import (
    GitError,
    RepoLocation,
    Snapshot,
    TooLarge,
    commits_touching,
    head_at,
    map_path,
    snapshot,
)
from composer_replication.tasks.sessions import SessionLog


class Dropped(Exception):
    """An episode that does not become a task; ``reason`` is one of the report's drop reasons."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason, self.detail = reason, detail.removeprefix(f"{reason}: ")
        super().__init__(f"{reason}: {detail}" if detail else reason)


@dataclass
class Options:
    repo_map: list[tuple[str, str]] = field(default_factory=list)
    timeout_s: float = 120.0  # per check
    env_cache: Any = None  # a Path; None = environment.default_cache()
    pip_args: list[str] = field(default_factory=list)
    max_task_bytes: int = MAX_TASK_BYTES  # the task loader's limits (datagen.tasks)


@dataclass
class SessionState:
    """What carries from one episode of a session to the next: changes not committed in between."""

    log: SessionLog
    loc: RepoLocation
    overlay: dict[str, bytes | None] = field(default_factory=dict)
    overlay_commit: str = ""
    broken: str = ""  # why an earlier episode on overlay_commit could not be replayed


@dataclass
class Built:
    draft: TaskDraft
    reference: dict[str, bytes | None]  # what the reference changes, beyond the test files (for the verifier)
    env: envmod.Environment


_SNAPSHOTS: dict[tuple[str, str], Snapshot] = {}


def _snapshot(top: str, commit: str) -> Snapshot:
    key = (top, commit)
    if key not in _SNAPSHOTS:
        if len(_SNAPSHOTS) > 8:
            _SNAPSHOTS.clear()
        _SNAPSHOTS[key] = snapshot(top, commit, max_files=MAX_TASK_FILES, max_bytes=4 * MAX_TASK_BYTES)
    return _SNAPSHOTS[key]


def build(state: SessionState, ep: Episode, opts: Options, redactor: Redactor) -> Built:
    """The draft task of ``ep`` (see module docstring)."""
    loc = state.loc
    commit, how, snap, start = _start(state, ep)
    dirty = sorted(state.overlay)
    unseen = _read_differs(ep, start, snap, loc, opts)
    try:
        changes = replay(start, snap.symlinks, ep.ops, loc, opts.repo_map)
    except ReplayError as e:
        state.broken = e.detail
        hint = f" (the session began on uncommitted changes to {', '.join(unseen[:3])})" if unseen else ""
        raise Dropped(e.reason, e.detail + hint) from None
    before = dict(state.overlay)
    state.overlay.update(changes)
    if not changes:
        raise Dropped("no file changes", "the recorded changes leave every file as it was")
    checks = _checks(ep, loc, opts, redactor)
    files, left_out = _start_texts(loc.top, snap, before, redactor, opts.max_task_bytes)
    final = {p: d for p, d in changes.items() if d is not None}
    after, _ = _texts(final, redactor, opts.max_task_bytes)
    if len(after) < len(final):
        raise Dropped("patch does not apply", "the reference changes a binary file")
    deleted = sorted(p for p, d in changes.items() if d is None)
    tests = {p: t for p, t in after.items() if is_test_path(p)}
    solution = {p: t for p, t in after.items() if p not in tests}
    files.update(tests)
    if len(files) + len(solution) > MAX_TASK_FILES:
        raise Dropped("repository too large", f"{len(files) + len(solution)} files, over {MAX_TASK_FILES}")
    env = envmod.detect(snap.files)
    envmod.prepare(env, opts.env_cache or envmod.default_cache(), pip_args=opts.pip_args)
    if env.error:
        raise Dropped("environment build failed", env.error)
    touching = commits_touching(loc.top, commit, ep.end_ts, sorted(changes))
    meta = {
        "source": state.log.source, "session_id": state.log.session_id, "session_file": state.log.path.name,
        "turns": list(ep.turn_range), "episode": ep.index, "repository": os.path.basename(loc.top),
        "commit": commit, "commit_found_by": how, "matching_commit": touching[0] if touching else "",
        "reference": "the episode's recorded edits, replayed onto the starting state",
        "started_dirty": bool(dirty), "uncommitted_at_start": dirty, "dirty_at_session_start": unseen,
        "left_out": [*snap.left_out, *(f"{p}: not UTF-8 text" for p in left_out)],
    }  # fmt: skip
    draft = TaskDraft(
        name=task_name(state.log.session_id, ep),
        instruction=redactor.redact("\n\n".join(m.strip() for m in ep.messages)),
        files=files, test_files=tests, solution=solution, deleted=deleted, checks=checks,
        timeout_s=opts.timeout_s, metadata=meta, environment=env.recipe(), env=envmod.task_env(env),
    )  # fmt: skip
    reference: dict[str, bytes | None] = {p: t.encode() for p, t in solution.items()}
    reference.update({p: None for p in deleted})
    return Built(draft, reference, env)


def task_name(session_id: str, ep: Episode) -> str:
    """``<session id>-t<first user turn>``: stable across runs, a safe file name."""
    return f"{safe_component(session_id, 36)}-t{ep.turn_range[0]:03d}"


def _start(state: SessionState, ep: Episode) -> tuple[str, str, Snapshot, dict[str, bytes]]:
    """The starting commit (and how it was found), its snapshot, and the starting files: the commit's plus
    what earlier episodes of the session changed without committing."""
    found = head_at(state.loc.top, ep.start_ts, state.log.branch)
    if isinstance(found, str):
        raise Dropped("commit not found", found)
    commit, how = found
    try:
        snap = _snapshot(state.loc.top, commit)
    except TooLarge as e:
        raise Dropped("repository too large", str(e)) from None
    except GitError as e:
        raise Dropped("commit not found", f"{commit[:12]} cannot be read ({e})") from None
    if state.overlay_commit != commit:
        state.overlay, state.overlay_commit, state.broken = {}, commit, ""
    if state.broken:
        why = f"an earlier episode's changes could not be replayed ({state.broken})"
        raise Dropped("patch does not apply", why)
    start = {**snap.files, **{p: d for p, d in state.overlay.items() if d is not None}}
    for p, d in state.overlay.items():
        if d is None:
            start.pop(p, None)
    return commit, how, snap, start


_READ_LINE = re.compile(r"^ *(\d+)(?:\u2192|\t)(.*)$", re.M)


def _read_differs(
    ep: Episode, start: dict[str, bytes], snap: Snapshot, loc: RepoLocation, opts: Options
) -> list[str]:
    """Files whose ``Read`` output, before the episode changed anything, differs from the starting files:
    the working tree held changes the miner cannot see (reported; the task is kept only if it validates)."""
    out: set[str] = set()
    for path, cwd, text in ep.reads_before_changes():
        try:
            rel = repo_path(path, cwd, loc, snap.symlinks, opts.repo_map)
        except ReplayError:
            continue
        data = start.get(rel)
        lines = data.decode("utf-8", "replace").split("\n") if data is not None else None
        for m in _READ_LINE.finditer(text):
            n, content = int(m.group(1)), m.group(2).rstrip("\r")
            if (
                lines is None
                or n > len(lines)
                or (len(content) < 2000 and lines[n - 1].rstrip("\r") != content)
            ):
                out.add(rel)
                break
    return sorted(out)


def _checks(ep: Episode, loc: RepoLocation, opts: Options, redactor: Redactor) -> list[str]:
    tops = tuple({loc.recorded_top, map_path(loc.recorded_top, opts.repo_map), loc.top})
    out: list[str] = []
    outside = secret = 0
    for cmd, workdir in ep.commands:
        wd = posixpath.normpath(workdir) if workdir else ""
        sub = next((wd[len(t) :].lstrip("/") for t in tops if wd == t or wd.startswith(t + "/")), None)
        if sub is None:
            sub = loc.subdir if not wd else None
        if sub is None:
            outside += 1
            continue
        for c in find_checks(cmd, sub, tops):
            if redactor.redact(c.command) != c.command:
                secret += 1
            elif c.command not in out:
                out.append(c.command)
    if not out:
        why = "the episode ran no recognised test command"
        if outside or secret:
            why += f" inside the repository ({outside} outside it, {secret} carrying a secret)"
        raise Dropped("no test run", why)
    return out


_TEXTS: dict[tuple[str, str], tuple[dict[str, str], list[str]]] = {}


def _start_texts(
    top: str, snap: Snapshot, overlay: dict[str, bytes | None], redactor: Redactor, limit: int
) -> tuple[dict[str, str], list[str]]:
    """The starting files as redacted text: the commit's (redacted once per commit) plus the overlay."""
    key = (top, snap.commit)
    if key not in _TEXTS:
        if len(_TEXTS) > 4:
            _TEXTS.clear()
        _TEXTS[key] = _texts(snap.files, redactor, limit)
    base, left = _TEXTS[key]
    files, left = dict(base), list(left)
    for p, d in overlay.items():
        files.pop(p, None)
        if d is not None:
            more, bad = _texts({p: d}, redactor, limit)
            files.update(more)
            left += bad
    return files, left


def _texts(files: dict[str, bytes], redactor: Redactor, limit: int) -> tuple[dict[str, str], list[str]]:
    """Text files, redacted; binary files are left out (and named)."""
    out: dict[str, str] = {}
    left: list[str] = []
    total = 0
    for p, data in files.items():
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            left.append(p)
            continue
        total += len(data)
        if total > limit:
            raise Dropped("repository too large", f"over {limit} bytes of text files (MAX_TASK_BYTES)")
        out[p] = redactor.redact(text)
    return out, sorted(left)
