"""One episode -> a task draft: starting commit, starting files, replayed reference, checks, redaction.

Raises `Dropped` with the report's reason when the episode cannot become a task. Validation (running the
checks) is `tasks.validate`; writing the folder is `tasks.layout`.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from typing import Any

from composer_replication.ingestion.redact import Redactor
from composer_replication.tasks import environment as envmod
from composer_replication.tasks.checks import find_checks
from composer_replication.tasks.edits import ReplayError, replay
from composer_replication.tasks.episodes import Episode
from composer_replication.tasks.layout import TaskDraft, is_test_path, safe_component
from composer_replication.tasks.repo import (
    GitError,
    RepoLocation,
    Snapshot,
    commits_touching,
    head_at,
    map_path,
    snapshot,
)
from composer_replication.tasks.sessions import SessionLog

MAX_TASK_BYTES = 64_000_000


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
    max_task_bytes: int = MAX_TASK_BYTES


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
        _SNAPSHOTS[key] = snapshot(top, commit)
    return _SNAPSHOTS[key]


def build(state: SessionState, ep: Episode, opts: Options, redactor: Redactor) -> Built:
    """The draft task of ``ep`` (see module docstring)."""
    log, loc = state.log, state.loc
    found = head_at(loc.top, ep.start_ts, log.branch)
    if isinstance(found, str):
        raise Dropped("commit not found", found)
    commit, how = found
    try:
        snap = _snapshot(loc.top, commit)
    except GitError as e:
        raise Dropped("commit not found", f"{commit[:12]} cannot be read ({e})") from None
    if state.overlay_commit != commit:
        state.overlay, state.overlay_commit, state.broken = {}, commit, ""
    if state.broken:
        raise Dropped(
            "patch does not apply", f"an earlier episode's changes could not be replayed ({state.broken})"
        )
    start = {**snap.files, **{p: d for p, d in state.overlay.items() if d is not None}}
    for p, d in state.overlay.items():
        if d is None:
            start.pop(p, None)
    dirty = sorted(state.overlay)
    try:
        changes = replay(start, snap.symlinks, ep.ops, loc, opts.repo_map)
    except ReplayError as e:
        state.broken = e.detail
        raise Dropped(e.reason, e.detail) from None
    state.overlay.update(changes)
    if not changes:
        raise Dropped("patch does not apply", "the recorded changes leave every file as it was")
    checks = _checks(ep, loc, opts, redactor)
    files, left_out = _texts(start, redactor, opts.max_task_bytes)
    final = {p: d for p, d in changes.items() if d is not None}
    after, _ = _texts(final, redactor, opts.max_task_bytes)
    if len(after) < len(final):
        raise Dropped("patch does not apply", "the reference changes a binary file")
    deleted = sorted(p for p, d in changes.items() if d is None)
    tests = {p: t for p, t in after.items() if is_test_path(p)}
    solution = {p: t for p, t in after.items() if p not in tests}
    files.update(tests)
    env = envmod.detect(snap.files)
    envmod.prepare(env, opts.env_cache or envmod.default_cache(), pip_args=opts.pip_args)
    if env.error:
        raise Dropped("environment build failed", env.error)
    touching = commits_touching(loc.top, commit, ep.end_ts, sorted(changes))
    meta = {
        "source": log.source,
        "session_id": log.session_id,
        "session_file": log.path.name,
        "turns": list(ep.turn_range),
        "episode": ep.index,
        "repository": os.path.basename(loc.top),
        "commit": commit,
        "commit_found_by": how,
        "matching_commit": touching[0] if touching else "",
        "reference": "the episode's recorded edits, replayed onto the starting state",
        "started_dirty": bool(dirty),
        "uncommitted_at_start": dirty,
        "left_out": [*snap.left_out, *(f"{p}: not UTF-8 text" for p in left_out)],
    }
    first = ep.turn_range[0]
    draft = TaskDraft(
        name=f"{safe_component(log.session_id, 36)}-t{first:03d}",
        instruction=redactor.redact("\n\n".join(m.strip() for m in ep.messages)),
        files=files, test_files=tests, solution=solution, deleted=deleted, checks=checks,
        timeout_s=opts.timeout_s, metadata=meta, environment=env.recipe(), env=envmod.task_env(env),
    )  # fmt: skip
    reference: dict[str, bytes | None] = {p: t.encode() for p, t in solution.items()}
    reference.update({p: None for p in deleted})
    return Built(draft, reference, env)


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
            raise Dropped("repository too large", f"over {limit // 1_000_000} MB of text files")
        out[p] = redactor.redact(text)
    return out, sorted(left)
