"""Writing a mined task folder in the Harbor / Terminal-Bench layout (`datagen.harbor` reads it back).

A folder is built beside its final place (``TASKS/.staging/NAME``, a folder without a ``task.toml`` of
its own, so task loaders never list it) and renamed into place in one step, so a crash never leaves half a
task where a re-run or a loader would take it for a finished one.
"""

from __future__ import annotations

import difflib
import os
import posixpath
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_replication.datagen import harbor

_TEST_NAME = re.compile(
    r"(^test_.*\.py$|_test\.py$|^conftest\.py$|_test\.go$|\.(test|spec)\.[cm]?[jt]sx?$|_spec\.rb$|_test\.exs$)"
)
STAGING = ".staging"
_TEST_DIRS = {"tests", "test", "__tests__", "spec", "testing"}


def is_test_path(path: str) -> bool:
    """A file the checks own: a test module by its name, or anything under a tests/test/spec folder."""
    parts = path.split("/")
    return bool(_TEST_NAME.search(parts[-1])) or any(p in _TEST_DIRS for p in parts[:-1])


@dataclass
class TaskDraft:
    """Everything a mined task folder holds (texts already redacted)."""

    name: str
    instruction: str
    files: dict[str, str]  # the workspace at the start
    test_files: dict[str, str]  # test files the reference added or changed (written before the checks)
    solution: dict[str, str]  # the reference's other changed files, whole
    deleted: list[str]  # files the reference deletes
    checks: list[str]
    timeout_s: float
    metadata: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # variables the checks run with
    verdict: dict[str, Any] = field(default_factory=dict)  # fail_to_pass, pass_to_pass after validation


def write_task(root: Path, draft: TaskDraft) -> Path:
    """Write ``draft`` under ``root/.staging/NAME`` and return that path (`publish` moves it into place)."""
    stage = root / STAGING / draft.name
    if stage.exists():
        shutil.rmtree(stage)
    for sub, files in (
        (harbor.REPO_DIR, draft.files),
        (harbor.TEST_FILES_DIR, draft.test_files),
        (harbor.SOLUTION_DIR, draft.solution),
    ):
        for rel, text in files.items():
            _write(stage / sub / rel, text)
    _write(stage / "instruction.md", draft.instruction.rstrip("\n") + "\n")
    _write(stage / "task.toml", task_toml(draft))
    _write(stage / "tests" / "test.sh", _test_sh(draft.checks), mode=0o755)
    _write(stage / "solution" / "patch.diff", unified_diff(draft))
    _write(stage / "solution" / "solve.sh", _SOLVE_SH, mode=0o755)
    _write(stage / "environment" / "Dockerfile", _dockerfile(draft.environment))
    return stage


def publish(stage: Path, final: Path) -> None:
    """Move a staged task folder to ``final``, replacing an older one there."""
    if final.exists():
        old = final.parent / STAGING / f".old-{final.name}"
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(stage, final)
        shutil.rmtree(old)
    else:
        os.replace(stage, final)


def task_toml(draft: TaskDraft) -> str:
    meta = {"name": draft.name, **draft.metadata}
    verifier = {"timeout_sec": float(draft.timeout_s), "checks": draft.checks, **draft.verdict}
    tables = {
        "metadata": meta,
        "verifier": verifier,
        "verifier.env": draft.env,
        "agent": {"timeout_sec": float(max(600.0, 5 * draft.timeout_s))},
        "solution": {"deleted": draft.deleted, "patch": "solution/patch.diff"},
        "environment": draft.environment,
    }
    return harbor.dumps(tables, top={"version": "1.0"})


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def unified_diff(draft: TaskDraft) -> str:
    """The reference change (test files included) as a ``patch -p1`` diff against the starting files."""
    out: list[str] = []
    changed = {**draft.solution, **draft.test_files}
    for rel in sorted({*changed, *draft.deleted}):
        before = draft.files.get(rel)
        after = None if rel in draft.deleted else changed.get(rel)
        out += difflib.unified_diff(
            (before or "").splitlines(keepends=True),
            (after or "").splitlines(keepends=True),
            "/dev/null" if before is None else f"a/{rel}",
            "/dev/null" if after is None else f"b/{rel}",
        )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out)


def _test_sh(checks: list[str]) -> str:
    body = "\n".join(f"( {c} ) || fail=1" for c in checks)
    return (
        "#!/bin/bash\n# The task's checks, run in the workspace after the test files are copied over it.\n"
        'cd "${WORKSPACE:-/workspace}" || exit 2\n'
        'cp -R "$(dirname "$0")/files/." . 2>/dev/null\n'
        f"fail=0\n{body}\n"
        "mkdir -p /logs/verifier 2>/dev/null && echo $((1 - fail)) > /logs/verifier/reward.txt\n"
        "exit $fail\n"
    )


_SOLVE_SH = (
    "#!/bin/bash\n# Applies the reference change in the workspace.\n"
    'cd "${WORKSPACE:-/workspace}" && patch -p1 --forward < "$(dirname "$0")/patch.diff"\n'
)


def _dockerfile(env: dict[str, Any]) -> str:
    lines = [f"FROM {env.get('image', 'python:3.11-slim')}", "WORKDIR /workspace", "COPY repo/ /workspace/"]
    lines += [f"RUN {c}" for c in env.get("install", [])]
    return "\n".join(lines) + "\n"


def safe_component(text: str, n: int = 40) -> str:
    """``text`` cut to letters, digits, ``.``, ``_``, ``-`` (a piece of a task name)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:n].strip("-._")
    return s or "x"


def quoted(path: str) -> str:
    return shlex.quote(posixpath.normpath(path))
