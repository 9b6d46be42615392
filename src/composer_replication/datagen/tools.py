"""The agent's tools (Bash, Read, Write, Edit) over a `Sandbox`, their JSON schemas, and the tool-call parser.

Tool names and input keys follow Claude Code (``Bash{command}``, ``Read{file_path}``,
``Write{file_path, content}``, ``Edit{file_path, old_string, new_string}``), so rollouts recorded in its
session-log format read exactly like real sessions. Model output is parsed in the one action format of
:mod:`composer_replication.wire` (one line ``[TOOL_USE] name=<tool> input=<json>`` per call), the same
format the model is trained on from ingested sessions and evaluated in.
"""

from __future__ import annotations

from typing import Any

from composer_replication import wire
from composer_replication.datagen.harness_base import ToolOutcome
from composer_replication.datagen.harness_claude import SANDBOX_TOOLS, ClaudeCodeTools
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


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """``[{"name", "input"}]`` from the action's tool lines (``wire.tool_calls``), tool names normalised
    (``bash`` -> ``Bash``); a malformed line becomes ``{"name": "_invalid"}``."""
    return [{**c, "name": _ALIASES.get(c["name"], c["name"])} for c in wire.tool_calls(text)]


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The action line `parse_tool_calls` reads (``wire.format_tool_use``; used by scripted policies)."""
    return wire.format_tool_use(name, arguments)


def run_tool(sb: Sandbox, name: str, args: dict[str, Any], *, timeout: float = 30.0) -> ToolOutcome:
    """Execute one call to the sandbox's four tools, statelessly: `harness_claude.ClaudeCodeTools`
    (Claude Code's result texts and records) without read-before-edit. Agent mistakes become tool
    errors; `SandboxError` (an infrastructure failure) propagates."""
    return ClaudeCodeTools(sb, tools=SANDBOX_TOOLS, require_read=False).call(name, args, timeout=timeout)


__all__ = [
    "TOOL_SCHEMAS",
    "Sandbox",
    "SandboxError",
    "ToolOutcome",
    "format_tool_call",
    "parse_tool_calls",
    "run_tool",
]
