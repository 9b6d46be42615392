"""Coding tasks: files (or a repository snapshot), an instruction, and a test command whose exit code is the reward.

A task is a directory::

    my_task/
      task.json        {"name", "instruction", "test_command", "timeout_s"?}
      files/**         copied into the sandbox workspace before the agent starts
      solution/**      optional: files that make the tests pass (used by the oracle policy and task checks)

`load_task` reads one, `load_tasks` a directory of them, `bundled_tasks` the small tasks shipped with the
package (``off_by_one``, ``implement_function``, ``fix_import``). `Task.from_repo` snapshots a local
repository's tracked files (``git ls-files``) so a real project can be a task.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUNDLED_DIR = Path(__file__).parent / "tasks"
_REQUIRED = ("name", "instruction", "test_command")
_MAX_FILE_BYTES = 1_000_000


@dataclass
class Task:
    """One coding task. ``files`` and ``solution`` map workspace-relative paths to text."""

    name: str
    instruction: str
    test_command: str
    files: dict[str, str] = field(default_factory=dict)
    solution: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0

    def to_row(self) -> dict[str, Any]:
        """A dataset row for TRL (``prompt`` conversational; ``task`` names the task for the env/reward)."""
        return {"prompt": [{"role": "user", "content": self.instruction}], "task": self.name}

    @classmethod
    def from_repo(
        cls, repo: str | Path, *, name: str, instruction: str, test_command: str, **kw: Any
    ) -> Task:
        """Snapshot the tracked text files of a git repository into a task."""
        repo = Path(repo)
        listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True)
        files = {}
        for rel in filter(None, listed.stdout.decode().split("\0")):
            p = repo / rel
            if p.is_file() and p.stat().st_size <= _MAX_FILE_BYTES:
                try:
                    files[rel] = p.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    continue  # binary files are not part of a text snapshot
        return cls(name=name, instruction=instruction, test_command=test_command, files=files, **kw)


def _read_tree(root: Path) -> dict[str, str]:
    if not root.is_dir():
        return {}
    return {
        p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def load_task(path: str | Path) -> Task:
    """Load a task directory (see module docstring). Raises ``ValueError`` naming the file and field."""
    path = Path(path)
    meta_path = path / "task.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: no task.json (a task directory needs task.json and files/)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{meta_path}: not valid JSON ({e})") from None
    missing = [k for k in _REQUIRED if not isinstance(meta.get(k), str) or not meta[k].strip()]
    if missing:
        raise ValueError(f"{meta_path}: missing or empty field(s) {missing}; each must be a non-empty string")
    unknown = set(meta) - {*_REQUIRED, "timeout_s"}
    if unknown:
        raise ValueError(
            f"{meta_path}: unknown field(s) {sorted(unknown)}; allowed: {[*_REQUIRED, 'timeout_s']}"
        )
    return Task(
        name=meta["name"],
        instruction=meta["instruction"],
        test_command=meta["test_command"],
        files=_read_tree(path / "files"),
        solution=_read_tree(path / "solution"),
        timeout_s=float(meta.get("timeout_s", 60.0)),
    )


def load_tasks(root: str | Path) -> list[Task]:
    """Every task directory under ``root`` (sorted by name)."""
    root = Path(root)
    tasks = [load_task(d) for d in sorted(root.iterdir()) if (d / "task.json").is_file()]
    if not tasks:
        raise FileNotFoundError(f"{root}: no task directories (each needs a task.json)")
    return tasks


def bundled_tasks() -> dict[str, Task]:
    """The small tasks shipped with the package, by name."""
    return {t.name: t for t in load_tasks(BUNDLED_DIR)}
