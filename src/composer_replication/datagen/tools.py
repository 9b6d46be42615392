"""The agent's tools (Bash, Read, Write, Edit) over a `Sandbox`, their JSON schemas, and the tool-call parser.

Tool names and input keys follow Claude Code (``Bash{command}``, ``Read{file_path}``,
``Write{file_path, content}``, ``Edit{file_path, old_string, new_string}``), so rollouts recorded in its
session-log format read exactly like real sessions. Model output is parsed in the one action format of
:mod:`composer_replication.wire` (one line ``[TOOL_USE] name=<tool> input=<json>`` per call), the same
format the model is trained on from ingested sessions and evaluated in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from composer_replication import wire
from composer_replication.datagen.sandbox import Sandbox, SandboxError
from composer_replication.tool_schemas import CLAUDE_CODE_TOOLS

# The sandbox's tools, with Claude Code's schemas (the one table in ``tool_schemas``).
TOOL_SCHEMAS: list[dict[str, Any]] = [CLAUDE_CODE_TOOLS[n] for n in ("Bash", "Read", "Write", "Edit")]
_ALIASES = {
    "bash": "Bash",
    "read": "Read",
    "write": "Write",
    "edit": "Edit",
    "read_file": "Read",
    "write_file": "Write",
}


@dataclass
class ToolOutcome:
    """What a tool returned: the text the model sees, whether it is an error, and Claude Code's ``toolUseResult``."""

    content: str
    is_error: bool
    tool_use_result: Any
    violations: list[str] = field(default_factory=list)


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """``[{"name", "input"}]`` from the action's tool lines (``wire.tool_calls``), tool names normalised
    (``bash`` -> ``Bash``); a malformed line becomes ``{"name": "_invalid"}``."""
    return [{**c, "name": _ALIASES.get(c["name"], c["name"])} for c in wire.tool_calls(text)]


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The action line `parse_tool_calls` reads (``wire.format_tool_use``; used by scripted policies)."""
    return wire.format_tool_use(name, arguments)


def _rel(sb: Sandbox, path: str) -> str:
    prefix = sb.workdir.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def _error(msg: str) -> ToolOutcome:
    return ToolOutcome(f"<tool_use_error>Error: {msg}</tool_use_error>", True, f"Error: {msg}")


def run_tool(sb: Sandbox, name: str, args: dict[str, Any], *, timeout: float = 30.0) -> ToolOutcome:
    """Execute one tool call. Agent mistakes become tool errors; `SandboxError` (infra) propagates."""
    try:
        if name == "Bash":
            r = sb.exec(str(args["command"]), timeout=timeout)
            text = r.output + ("\n[killed: timeout]" if r.timed_out else "")
            # Like Claude Code, a non-zero exit is visible in the output (and flagged as an error here).
            result = {"stdout": r.output, "stderr": "", "interrupted": r.timed_out, "isImage": False}
            return ToolOutcome(text, not r.ok, result, list(r.violations))
        if name == "Read":
            data = sb.get(_rel(sb, str(args["file_path"]))).decode("utf-8", errors="replace")
            numbered = "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(data.splitlines(), 1))
            info = {"filePath": args["file_path"], "content": data, "numLines": data.count("\n") + 1}
            return ToolOutcome(numbered, False, {"type": "text", "file": info})
        if name == "Write":
            sb.put(_rel(sb, str(args["file_path"])), str(args["content"]))
            return ToolOutcome(f"File written: {args['file_path']}", False, {"type": "create", **args})
        if name == "Edit":
            path = _rel(sb, str(args["file_path"]))
            old, new = str(args["old_string"]), str(args["new_string"])
            text = sb.get(path).decode("utf-8")
            count = text.count(old)
            if count != 1 or not old:
                return _error(f"old_string found {count} times in {args['file_path']} (must be exactly once)")
            sb.put(path, text.replace(old, new, 1))
            return ToolOutcome(f"Edited {args['file_path']}", False, {"oldString": old, "newString": new})
        if name == "_invalid":
            return _error(f"malformed tool call: {args.get('error')}")
        return _error(f"unknown tool {name!r}; available: Bash, Read, Write, Edit")
    except SandboxError:
        raise
    except KeyError as e:
        return _error(f"{name}: missing argument {e}")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return _error(f"{name}: {e}")
