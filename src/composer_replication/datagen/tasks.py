"""Coding tasks: files (or a repository snapshot), an instruction, and a test command whose exit code is the reward.

A task is a directory::

    my_task/
      task.json        {"name", "instruction", "test_command", "timeout_s"?, "checks"?, "env"?, "example_call"?}
      files/**         copied into the sandbox workspace before the agent starts
      solution/**      optional: files that make the tests pass (used by the oracle policy and task checks)

``checks`` (optional) lists the commands the verifier (`datagen.verifier`) runs and scores one by one
(default: ``[test_command]``); ``env`` (optional) maps variable names to values the checks run with;
``example_call`` (optional, ``{"name", "arguments"}``) is a tool call the prompt shows after the
instruction in the active wire format (`wire.example_call`), so an instruction never hard-codes one format.
A task holds at most `MAX_TASK_FILES` files and `MAX_TASK_BYTES` bytes (``files/`` and ``solution/``
together); a bigger one raises ``ValueError`` naming the task and the limit.

A task may also use the Harbor / Terminal-Bench layout (``instruction.md``, ``task.toml``,
``environment/repo/``, ``tests/``, ``solution/``; see `datagen.harbor`), which mined tasks use.

`load_task` reads one (either layout), `load_tasks` a directory of them, `bundled_tasks` the small tasks
shipped with the package (``off_by_one``, ``implement_function``, ``fix_import``). `Task.from_repo`
snapshots a local repository's tracked files (``git ls-files``) so a real project can be a task.

Nothing outside a task's root is ever read: files are opened component by component with
``O_NOFOLLOW`` from the root's directory descriptor; a symlink (git-tracked ones included) is followed
only when its target stays inside the root, and one that leaves it (``-> /etc/passwd``,
``-> /proc/self/environ``) raises `TaskFileError` naming the file and its target, as do FIFOs, sockets
and devices. Task names are checked by `check_name` (letters, digits, ``.``, ``_``, ``-``; no path
separator, no ``..``) because they become file names of rollout outputs (`path_inside`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUNDLED_DIR = Path(__file__).parent / "tasks"
_REQUIRED = ("name", "instruction", "test_command")
_OPTIONAL = ("timeout_s", "checks", "env", "example_call")
_MAX_FILE_BYTES = 1_000_000
MAX_TASK_FILES = 10_000
MAX_TASK_BYTES = 32 * 1024 * 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class TaskFileError(ValueError):
    """A task file that cannot be read safely: a symlink leaving the task root, or not a regular file."""


class _Budget:
    """The files and bytes a task may still hold (`MAX_TASK_FILES`, `MAX_TASK_BYTES`)."""

    def __init__(self, where: str) -> None:
        self.where, self.files, self.bytes = where, MAX_TASK_FILES, MAX_TASK_BYTES

    def take(self, files: int = 0, nbytes: int = 0) -> None:
        self.files, self.bytes = self.files - files, self.bytes - nbytes
        if self.files < 0:
            raise ValueError(
                f"{self.where}: more than {MAX_TASK_FILES} files (MAX_TASK_FILES); a task must be smaller"
            )
        if self.bytes < 0:
            raise ValueError(
                f"{self.where}: more than {MAX_TASK_BYTES} bytes of files (MAX_TASK_BYTES); a task must be "
                "smaller"
            )


def check_name(name: object, what: str = "task name") -> str:
    """Return ``name`` if it is safe as a single file-name component; raise ``ValueError`` otherwise.

    Allowed: 1-128 letters, digits, ``.``, ``_``, ``-``, starting with a letter or digit, without ``..``.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            f"{what} {name!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (no '/', '\\' or '..')"
        )
    return name


def path_inside(directory: str | Path, name: str, suffix: str = "") -> Path:
    """``directory / (name + suffix)`` after `check_name`, verified to stay inside ``directory``."""
    check_name(name)
    directory = Path(directory)
    target = directory / f"{name}{suffix}"
    if target.parent != directory or os.path.realpath(target.parent) != os.path.realpath(directory):
        raise ValueError(f"output path {target} is not directly inside {directory}")
    return target


@dataclass
class Task:
    """One coding task. ``files`` and ``solution`` map workspace-relative paths to text."""

    name: str
    instruction: str
    test_command: str
    files: dict[str, str] = field(default_factory=dict)
    solution: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0
    check_commands: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    example_call: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        c = self.example_call
        if c is not None and not (
            isinstance(c, dict) and set(c) == {"name", "arguments"} and isinstance(c["name"], str)
            and c["name"].strip() and isinstance(c["arguments"], dict)
        ):
            raise ValueError(
                f"task {self.name!r}: example_call must be {{\"name\": TOOL, \"arguments\": {{...}}}}; got {c!r}"
            )
        if not all(isinstance(c, str) and c.strip() for c in self.check_commands):
            raise ValueError(f"task {self.name!r}: check_commands must be non-empty strings")
        bad = [k for k, v in self.env.items() if not (_ENV_NAME.fullmatch(k) and isinstance(v, str))]
        if bad:
            raise ValueError(
                f"task {self.name!r}: env names must be [A-Za-z_][A-Za-z0-9_]*, values strings: {bad}"
            )

    @property
    def checks(self) -> list[str]:
        """The commands that decide the task, each scored on its own (default ``[test_command]``)."""
        return list(self.check_commands) or [self.test_command]

    def to_row(self) -> dict[str, Any]:
        """A dataset row for TRL (``prompt`` conversational; ``task`` names the task for the env/reward)."""
        return {"prompt": [{"role": "user", "content": self.instruction}], "task": self.name}

    @classmethod
    def from_repo(
        cls, repo: str | Path, *, name: str, instruction: str, test_command: str, **kw: Any
    ) -> Task:
        """Snapshot the tracked text files of a git repository into a task.

        Binary files, files over 1 MB and symlinks to directories inside the repository are left out; a
        tracked symlink leaving the repository raises `TaskFileError`.
        """
        check_name(name)
        repo = Path(repo)
        listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True)
        files = {}
        budget = _Budget(f"task {name!r} (repository {repo})")
        root_fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for rel in filter(None, listed.stdout.decode().split("\0")):
                data = _read_beneath(root_fd, repo, rel, limit=_MAX_FILE_BYTES)
                if data is None:
                    continue
                budget.take(1, len(data))
                try:
                    files[rel] = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # binary files are not part of a text snapshot
        finally:
            os.close(root_fd)
        return cls(name=name, instruction=instruction, test_command=test_command, files=files, **kw)


def _open_beneath(root_fd: int, rel: str) -> int:
    """Open ``rel`` under ``root_fd`` without following any symlink (``OSError`` ELOOP/ENOTDIR on one)."""
    parts = rel.split("/")
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=fd)
    finally:
        os.close(fd)


def _read_beneath(
    root_fd: int, root: Path, rel: str, *, limit: int | None = None, budget: _Budget | None = None
) -> bytes | None:
    """The bytes of ``root/rel``, never reading outside ``root`` (see module docstring).

    None for a symlink to a directory inside the root, or a file over ``limit`` bytes; a file that
    would take ``budget`` past its bytes raises ``ValueError`` before it is read.
    """
    try:
        fd = _open_beneath(root_fd, rel)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        real, root_real = os.path.realpath(root / rel), os.path.realpath(root)
        if os.path.commonpath([real, root_real]) != root_real:
            raise TaskFileError(
                f"{root / rel}: a symlink to {real!r}, outside the task root {root_real}; tasks may only "
                "link to files inside their own directory (replace the link with the file's content)"
            ) from None
        if os.path.isdir(real):
            return None
        try:
            fd = _open_beneath(root_fd, os.path.relpath(real, root_real))
        except OSError as e2:
            raise TaskFileError(f"{root / rel}: could not be opened inside the task root ({e2})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise TaskFileError(f"{root / rel}: not a regular file (a FIFO, socket or device); remove it")
        if limit is not None and st.st_size > limit:
            return None
        if budget is not None:
            budget.take(0, st.st_size)
        return f.read()


def _read_tree(task_root: Path, sub: str, budget: _Budget) -> dict[str, str]:
    """Every file under ``task_root/sub`` (keys relative to it), read by `_read_beneath`."""
    root_fd = os.open(task_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not os.path.lexists(task_root / sub):
            return {}
        rels: list[str] = []
        pending = [sub]
        while pending:
            rel_dir = pending.pop()
            try:
                dir_fd = _open_beneath(root_fd, rel_dir)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                real = os.path.realpath(task_root / rel_dir)
                if os.path.commonpath([real, os.path.realpath(task_root)]) != os.path.realpath(task_root):
                    raise TaskFileError(
                        f"{task_root / rel_dir}: a symlink to {real!r}, outside the task root {task_root}"
                    ) from None
                raise TaskFileError(
                    f"{task_root / rel_dir}: a symlinked directory; use a real directory in a task"
                ) from None
            with os.scandir(dir_fd) as it:
                for entry in it:
                    rel = f"{rel_dir}/{entry.name}"
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(rel)
                    else:
                        rels.append(rel)
                        budget.take(1)
            os.close(dir_fd)
        out = {}
        for rel in sorted(rels):
            data = _read_beneath(root_fd, task_root, rel, budget=budget)
            if data is None:
                raise TaskFileError(
                    f"{task_root / rel}: a symlinked directory; use a real directory in a task"
                )
            try:
                out[rel[len(sub) + 1 :]] = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{task_root / rel}: not UTF-8 text (task files are text)") from None
        return out
    finally:
        os.close(root_fd)


def load_task(path: str | Path) -> Task:
    """Load a task directory (see module docstring). Raises ``ValueError`` naming the file and field."""
    path = Path(path)
    meta_path = path / "task.json"
    if not os.path.lexists(meta_path) and os.path.lexists(path / "task.toml"):
        return _load_harbor(path)
    if not os.path.lexists(meta_path):
        raise FileNotFoundError(
            f"{meta_path}: no task.json (a task directory needs task.json and files/, or the Harbor "
            "layout: task.toml, instruction.md and environment/repo/)"
        )
    root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        raw = _read_beneath(root_fd, path, "task.json") or b""
    finally:
        os.close(root_fd)
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{meta_path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path}: must hold a JSON object with {list(_REQUIRED)}")
    missing = [k for k in _REQUIRED if not isinstance(meta.get(k), str) or not meta[k].strip()]
    if missing:
        raise ValueError(f"{meta_path}: missing or empty field(s) {missing}; each must be a non-empty string")
    unknown = set(meta) - {*_REQUIRED, *_OPTIONAL}
    if unknown:
        raise ValueError(
            f"{meta_path}: unknown field(s) {sorted(unknown)}; allowed: {[*_REQUIRED, *_OPTIONAL]}"
        )
    try:
        check_name(meta["name"])
    except ValueError as e:
        raise ValueError(f"{meta_path}: field 'name': {e}") from None
    checks, env = meta.get("checks", []), meta.get("env", {})
    if not isinstance(checks, list) or not all(isinstance(c, str) and c.strip() for c in checks):
        raise ValueError(f"{meta_path}: field 'checks' must be a list of non-empty command strings")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError(f"{meta_path}: field 'env' must be an object of name -> string value")
    budget = _Budget(f"task {meta['name']!r} ({path})")
    files, solution = _read_tree(path, "files", budget), _read_tree(path, "solution", budget)
    try:
        return Task(
            name=meta["name"],
            instruction=meta["instruction"],
            test_command=meta["test_command"],
            files=files,
            solution=solution,
            timeout_s=float(meta.get("timeout_s", 60.0)),
            check_commands=checks,
            env=env,
            example_call=meta.get("example_call"),
        )
    except ValueError as e:
        raise ValueError(f"{meta_path}: {e}") from None


def _load_harbor(path: Path) -> Task:
    from composer_replication.datagen import harbor

    root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        raw = _read_beneath(root_fd, path, "task.toml") or b""
        if not os.path.lexists(path / "instruction.md"):
            raise FileNotFoundError(f"{path / 'instruction.md'}: missing (a Harbor task needs its instruction)")
        text = _read_beneath(root_fd, path, "instruction.md") or b""
    finally:
        os.close(root_fd)
    meta = harbor.parse_task_toml(raw, str(path / "task.toml"), path.name)
    try:
        check_name(meta["name"])
    except ValueError as e:
        raise ValueError(f"{path / 'task.toml'}: [metadata] name: {e}") from None
    try:
        instruction = text.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path / 'instruction.md'}: not UTF-8 text") from None
    if not instruction.strip():
        raise ValueError(f"{path / 'instruction.md'}: empty; write the task's instruction there")
    budget = _Budget(f"task {meta['name']!r} ({path})")
    files = _read_tree(path, harbor.REPO_DIR, budget)
    files.update(_read_tree(path, harbor.TEST_FILES_DIR, budget))
    solution = _read_tree(path, harbor.SOLUTION_DIR, budget)
    try:
        return Task(
            name=meta["name"], instruction=instruction, test_command=harbor.joined_command(meta["checks"]),
            files=files, solution=solution, timeout_s=meta["timeout_s"], check_commands=meta["checks"],
            env=meta["env"],
        )  # fmt: skip
    except ValueError as e:
        raise ValueError(f"{path / 'task.toml'}: {e}") from None


def load_tasks(root: str | Path) -> list[Task]:
    """Every task directory under ``root`` (sorted by name)."""
    root = Path(root)
    root_real = os.path.realpath(root)
    tasks = []
    for d in sorted(root.iterdir()):
        if not os.path.lexists(d / "task.json") and not os.path.lexists(d / "task.toml"):
            continue
        if d.is_symlink() and os.path.commonpath([os.path.realpath(d), root_real]) != root_real:
            raise TaskFileError(f"{d}: a symlink to {os.path.realpath(d)!r}, outside the tasks root {root}")
        tasks.append(load_task(d))
    if not tasks:
        raise FileNotFoundError(f"{root}: no task directories (each needs a task.json or a task.toml)")
    return tasks


def bundled_tasks() -> dict[str, Task]:
    """The small tasks shipped with the package, by name."""
    return {t.name: t for t in load_tasks(BUNDLED_DIR)}
