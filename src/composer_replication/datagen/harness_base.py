"""What the harness modules share: the tool-outcome record, workspace path checks, argument checks
against the tool schemas, and running a fixed helper program inside the sandbox.

`harness_claude` (Claude Code's tools), `harness_search` (its Grep/Glob/LS) and `harness_codex`
(Codex's tools) build on this; none of them imports the others' dispatch.
"""

from __future__ import annotations

import base64
import errno
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from composer_replication.datagen.sandbox import Sandbox, SandboxError
from composer_replication.tool_schemas import input_problems

__all__ = [
    "HelperError",
    "ToolOutcome",
    "arg_problems",
    "read_file",
    "refusal",
    "run_helper",
    "workspace_relpath",
]


@dataclass
class ToolOutcome:
    """What a tool returned: the text the model sees, whether it is an error, the structured result the
    harness logs (Claude Code's ``toolUseResult``; Codex logs only ``content``), and sandbox violations."""

    content: str
    is_error: bool
    tool_use_result: Any
    violations: list[str] = field(default_factory=list)


class HelperError(ValueError):
    """The in-sandbox helper refused or failed (a bad path, a bad pattern): the agent's error."""


def workspace_relpath(path: Any, root: str) -> str | None:
    """``path`` (absolute under ``root``, or relative to it) as a normalised workspace-relative path;
    ``""`` for the root itself; None when it is not a string, names another absolute place, holds a
    NUL, or climbs out with ``..``."""
    if not isinstance(path, str) or "\x00" in path:
        return None
    p = path.strip()
    root = root.rstrip("/")
    if p == root or p == root + "/":
        return ""
    if p.startswith("/"):
        if not p.startswith(root + "/"):
            return None
        p = p[len(root) + 1 :]
    parts = [s for s in p.split("/") if s not in ("", ".")]
    return None if ".." in parts else "/".join(parts)


def read_file(sb: Sandbox, rel: str) -> bytes:
    """``sb.get(rel)`` with the backends' errors made alike: `FileNotFoundError` (missing),
    `IsADirectoryError` (a directory; docker reports it as a failed ``cat``), `PermissionError` with
    ``EACCES`` (the path, or a symlink on it, leaves the workspace)."""
    try:
        return sb.get(rel)
    except FileNotFoundError as e:
        if "Is a directory" in str(e):
            raise IsADirectoryError(errno.EISDIR, str(e)) from None
        raise
    except PermissionError as e:
        raise PermissionError(errno.EACCES, str(e)) from None


def arg_problems(schema: dict[str, Any] | None, args: Any) -> list[str]:
    """``tool_schemas.input_problems`` without its ``name: `` prefixes ([] when ``schema`` is None)."""
    if schema is None:
        return []
    name = schema["function"]["name"]
    return [p.removeprefix(f"{name}: ") for p in input_problems(schema, args)]


def refusal(
    name: str, args: Any, tools: Sequence[str], schemas: Mapping[str, dict[str, Any]]
) -> tuple[str, Any] | None:
    """Why a tool call may not run, checked in the order every harness checks (each words it its own way):
    ``("invalid", error)`` for model output that did not parse into a call (the ``_invalid`` pseudo-tool),
    ``("unknown", name)`` for a tool not on offer, ``("args", problems)`` for arguments that break the
    tool's schema; None when it may run."""
    if name == "_invalid":
        return "invalid", args.get("error")
    if name not in tools:
        return "unknown", name
    problems = arg_problems(schemas.get(name), args)
    return ("args", problems) if problems else None


def run_helper(
    sb: Sandbox, program: str, payload: dict[str, Any], *, timeout: float
) -> tuple[Any, list[str]]:
    """Run the Python ``program`` inside ``sb`` with ``payload`` (JSON, base64 on the command line, so
    the command tripwire sees no agent text); it prints one JSON object: ``{"ok": ...}`` or
    ``{"error": "..."}`` (raised as `HelperError`). Returns ``(ok value, violations)``.

    A helper that times out or prints no JSON is an agent-visible error too (a huge tree, a
    pathological regex), never an infrastructure failure; `SandboxError` propagates."""
    arg = base64.b64encode(json.dumps(payload).encode()).decode()
    r = sb.exec(f"python3 -c {shlex.quote(program)} {arg}", timeout=timeout)
    if r.timed_out:
        raise HelperError(f"timed out after {timeout:g}s")
    lines = r.output.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else None
    except ValueError:
        out = None
    if not isinstance(out, dict):
        if r.returncode == 127:
            raise SandboxError(f"the sandbox has no python3 for the search tools: {r.output[:200]}")
        raise HelperError(r.output.strip()[-300:] or f"helper exited {r.returncode}")
    if "error" in out:
        raise HelperError(str(out["error"]))
    return out.get("ok"), list(r.violations)
