"""Which workspace paths decide how a task's tests run, and so are taken from the task, never the agent.

`split_changes(task, changes)` sorts an agent's changes (task-relative path -> new bytes, or None for a
deletion) into the ones the verifier applies and the ones it refuses:

- **protected** (refused; the task's own version stays, and the attempt is recorded in
  ``touched``): test files (``test_*.py``, ``*_test.py``, anything under a ``tests/`` or ``test/``
  directory), ``conftest.py`` at any depth, pytest/tox/nox settings (``pytest.ini``, ``.pytest.ini``,
  ``pytest.toml``, ``.pytest.toml``, ``tox.ini``, ``noxfile.py``), Python start-up hooks
  (``sitecustomize.py``, ``usercustomize.py``, ``*.pth``), new modules named like the test runner
  (``pytest``, ``_pytest``, ``pluggy``, ``py``, ``iniconfig``, ``packaging``) at the top level or in a
  directory of the task's ``PYTHONPATH``, every file a check
  command names (``bash run_tests.sh``, ``pytest -c ci.ini``) and, when a check runs ``make``, the
  Makefile;
- **test sections** of ``pyproject.toml`` (``[tool.pytest]``, ``[tool.pytest.ini_options]``) and
  ``setup.cfg`` (``[tool:pytest]``, ``[pytest]``): a change that leaves them as the task has them is
  applied; one that alters them is refused like a protected file;
- **caches** (``__pycache__/``, ``*.pyc``, ``*.pyo``, ``.pytest_cache/``, ``.mypy_cache/``,
  ``.ruff_cache/``, ``.hypothesis/``): never applied (the checks rebuild what they need from source);
  a compiled file for a protected source (``__pycache__/test_x.cpython-311.pyc``) also counts as
  touched.

A change that rewrites a file with the task's own bytes is no change. Paths that are absolute or hold
``..`` are refused (``dropped``).
"""

from __future__ import annotations

import configparser
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from composer_replication.datagen.sandbox_base import safe_relpath
from composer_replication.datagen.tasks import Task

__all__ = [
    "Split",
    "cache_source",
    "is_cache",
    "is_protected",
    "is_test_file",
    "runner_settings",
    "split_changes",
]

Changes = dict[str, bytes | None]
_CONFIG_NAMES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "noxfile.py"}
    | {"sitecustomize.py", "usercustomize.py"}
)
_TEST_DIRS = frozenset({"tests", "test"})
_RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging"})
_CACHE_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"})
_MAKEFILES = ("Makefile", "makefile", "GNUmakefile")
_PYC = re.compile(r"(?P<mod>[^/.]+)(\.[A-Za-z0-9_-]+)*\.py[co]$")


@dataclass
class Split:
    """`split_changes`' answer: what to apply, which protected paths were touched, what was refused."""

    kept: Changes = field(default_factory=dict)
    touched: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def is_test_file(path: str) -> bool:
    """``test_*.py`` / ``*_test.py`` anywhere, or any file under a ``tests/`` or ``test/`` directory."""
    p = PurePosixPath(path)
    name = p.name
    by_name = name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))
    return by_name or any(part in _TEST_DIRS for part in p.parts[:-1])


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


def _named_by_checks(task: Task) -> set[str]:
    """Files the check commands name (normalised like workspace paths), the Makefile if one runs make."""
    named: set[str] = set()
    for check in task.checks:
        for word in _words(check):
            for candidate in {word, word.partition("=")[2]} - {""}:  # `--opt=path`, `VAR=path`
                try:
                    named.add(safe_relpath(candidate.removeprefix("./")))
                except ValueError:
                    continue
            if PurePosixPath(word).name in ("make", "gmake"):
                named.update(_MAKEFILES)
    return named


def _import_roots(task: Task) -> list[PurePosixPath]:
    """Where a new module shadows the test runner: the workspace root and the task's PYTHONPATH dirs."""
    roots = [PurePosixPath()]
    for entry in task.env.get("PYTHONPATH", "").split(":"):
        try:
            roots.append(PurePosixPath(safe_relpath(entry.removeprefix("./"))))
        except ValueError:
            continue
    return roots


def is_protected(task: Task, path: str, named: set[str] | None = None) -> bool:
    """Whether ``path`` (task-relative) is taken from the task whatever the agent did (module docstring).

    ``named``: `_named_by_checks` of ``task``, when the caller asks about many paths."""
    p = PurePosixPath(path)
    if p.name in _CONFIG_NAMES or p.name.endswith(".pth") or is_test_file(path):
        return True
    if path not in task.files and any(
        p.parts[len(d.parts)].removesuffix(".py") in _RUNNER_MODULES
        for d in _import_roots(task)
        if p.parts[: len(d.parts)] == d.parts and len(p.parts) > len(d.parts)
    ):
        return True
    return path in (_named_by_checks(task) if named is None else named)


def is_cache(path: str) -> bool:
    """A compiled file or a tool cache: never carried from the agent's workspace."""
    p = PurePosixPath(path)
    return p.suffix in (".pyc", ".pyo") or any(part in _CACHE_DIRS for part in p.parts)


def cache_source(path: str) -> str | None:
    """The source a compiled file stands for (``a/__pycache__/m.cpython-311.pyc`` -> ``a/m.py``)."""
    p = PurePosixPath(path)
    m = _PYC.fullmatch(p.name)
    if m is None:
        return None
    parent = p.parent.parent if p.parent.name == "__pycache__" else p.parent
    return str(parent / f"{m['mod']}.py") if str(parent) != "." else f"{m['mod']}.py"


def runner_settings(path: str, data: bytes | str | None) -> Any:
    """The test-runner sections of a ``pyproject.toml`` / ``setup.cfg`` (``"<unreadable>"`` if it does
    not parse, None for any other file or no file)."""
    name = PurePosixPath(path).name
    if data is None or name not in ("pyproject.toml", "setup.cfg"):
        return None
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        if name == "pyproject.toml":
            return tomllib.loads(text).get("tool", {}).get("pytest")
        cfg = configparser.ConfigParser(interpolation=None)
        cfg.read_string(text)
        return {s: dict(cfg[s]) for s in ("tool:pytest", "pytest") if cfg.has_section(s)} or None
    except (tomllib.TOMLDecodeError, configparser.Error, AttributeError):
        return "<unreadable>"


def split_changes(task: Task, changes: Changes) -> Split:
    """Sort ``changes`` into applied / protected-and-touched / dropped (module docstring)."""
    out, named = Split(), _named_by_checks(task)
    for raw, data in sorted(changes.items()):
        try:
            path = safe_relpath(raw)
        except ValueError:
            out.dropped.append(raw)
            continue
        orig = task.files.get(path)
        if (data is None and orig is None) or (
            data is not None and orig is not None and data == orig.encode()
        ):
            continue
        if is_cache(path):
            src = cache_source(path)
            (out.touched if src and is_protected(task, src, named) else out.dropped).append(path)
        elif is_protected(task, path, named) or runner_settings(path, orig) != runner_settings(path, data):
            out.touched.append(path)
        else:
            out.kept[path] = data
    return out
