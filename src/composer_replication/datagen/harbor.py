"""The Harbor / Terminal-Bench task layout, as `datagen.tasks.load_task` reads it (mined tasks use it)::

    my_task/
      instruction.md       what the agent is asked to do
      task.toml            [metadata] name, provenance; [verifier] checks, timeout_sec; [verifier.env]
                           variables the checks run with; [agent] timeout_sec
      environment/repo/**  the workspace the agent starts from (a repository at its starting commit)
      environment/...      how to build that environment elsewhere (Dockerfile, setup.sh)
      tests/test.sh        runs the checks (for Harbor runners)
      tests/files/**       test files written over the workspace before the checks run
      solution/solve.sh    applies solution/patch.diff (for Harbor runners)
      solution/files/**    the reference solution's changed files, whole

This module only reads and checks ``task.toml`` (`parse_task_toml`) and writes TOML (`dumps`);
`datagen.tasks` reads the files, with the same no-symlink-out rules as the ``task.json`` layout.
"""

from __future__ import annotations

import json
import tomllib
from typing import Any

REPO_DIR = "environment/repo"
TEST_FILES_DIR = "tests/files"
SOLUTION_DIR = "solution/files"


def parse_task_toml(raw: bytes, where: str, default_name: str) -> dict[str, Any]:
    """``{"name", "checks", "timeout_s", "metadata"}`` from a ``task.toml``; ``ValueError`` naming the
    file and the field otherwise."""
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not valid TOML ({e})") from None
    meta = _table(data, "metadata", where)
    verifier = _table(data, "verifier", where)
    name = meta.get("name", default_name)  # checked by the caller (datagen.tasks.check_name)
    checks = verifier.get("checks")
    if (
        not isinstance(checks, list)
        or not checks
        or not all(isinstance(c, str) and c.strip() for c in checks)
    ):
        raise ValueError(f"{where}: [verifier] checks must be a non-empty list of command strings")
    timeout = verifier.get("timeout_sec", 60.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
        raise ValueError(f"{where}: [verifier] timeout_sec must be a number of seconds in (0, 86400]")
    env = verifier.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError(f"{where}: [verifier.env] must map variable names to strings")
    return {"name": name, "checks": list(checks), "timeout_s": float(timeout), "metadata": meta, "env": env}


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    t = data.get(key, {})
    if not isinstance(t, dict):
        raise ValueError(f"{where}: [{key}] must be a table")
    return t


def joined_command(checks: list[str]) -> str:
    """One shell line running every check (each in a subshell) and failing when any fails."""
    return "fail=0; " + " ".join(f"( {c} ) || fail=1;" for c in checks) + " exit $fail"


def dumps(tables: dict[str, dict[str, Any]], top: dict[str, Any] | None = None) -> str:
    """TOML for tables of strings, numbers, booleans and lists of those (what ``task.toml`` needs)."""
    lines = [f"{k} = {_value(v)}" for k, v in (top or {}).items()]
    for name, table in tables.items():
        if not table and "." in name:
            continue
        lines += ["", f"[{name}]"] + [f"{k} = {_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines).lstrip("\n") + "\n"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        # A JSON string is a TOML basic string, except that TOML wants DEL escaped too.
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"task.toml cannot hold {type(v).__name__}")
