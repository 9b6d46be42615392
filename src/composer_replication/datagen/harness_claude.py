"""Claude Code's tools over a `Sandbox`, with the input and output shapes of its session logs.

What is covered: ``Bash``, ``Read``, ``Write``, ``Edit``, ``MultiEdit``, ``TodoWrite`` here and ``Grep``,
``Glob``, ``LS`` in `harness_search`; arguments are checked against ``tool_schemas.CLAUDE_CODE_TOOLS``.
Each call returns the ``tool_result`` text the model sees and the ``toolUseResult`` object Claude Code
records (2.1.x shapes, read off real logs): ``Read`` numbers lines ``"{n:>6}→{line}"`` and records
``{type: "text", file: {filePath, content, numLines, startLine, totalLines}}``; ``Edit`` records
``{filePath, oldString, newString, originalFile, structuredPatch, userModified, replaceAll}``; a failed
``Bash`` command returns ``Exit code N`` + its output with ``is_error``; tool errors are wrapped in
``<tool_use_error>`` with ``toolUseResult = "Error: ..."`` (``String to replace not found in file.``,
``Found N matches of the string to replace, but replace_all is false. ...``, ``File has not been read
yet. Read it first before writing to it.``, ``File does not exist.``, ``InputValidationError: ...``).

Paths are absolute under the sandbox's workspace (``/workspace/...``) or relative to it; anything else
(``..``, another absolute path, a symlink that leaves the workspace) is refused with a permission error.
With ``require_read`` (a rollout in the ``claude_code`` harness), editing or overwriting an existing file
needs a ``Read`` of it first, and a file changed since (by a command) must be read again, as in Claude
Code; the stateless `datagen.tools.run_tool` path turns that off.

What is not covered: images and notebooks in ``Read``, background shells, hooks and permission prompts;
``Bash`` output is stdout and stderr together (the sandbox merges them) in ``stdout``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any

from composer_replication.datagen import harness_search
from composer_replication.datagen.harness_base import (
    HelperError,
    ToolOutcome,
    read_file,
    refusal,
    workspace_relpath,
)
from composer_replication.datagen.sandbox import Sandbox, SandboxError
from composer_replication.tool_schemas import CLAUDE_CODE_TOOLS

__all__ = ["CLAUDE_TOOLS", "SANDBOX_TOOLS", "ClaudeCodeTools", "structured_patch"]

CLAUDE_TOOLS = ("Bash", "Read", "Write", "Edit", "MultiEdit", "Grep", "Glob", "LS", "TodoWrite")
SANDBOX_TOOLS = ("Bash", "Read", "Write", "Edit")  # the four-tool surface of `datagen.tools.TOOL_SCHEMAS`
MAX_READ_BYTES = 256 * 1024
READ_LINES, LINE_CHARS = 2000, 2000
_NO_MATCH_CMDS = re.compile(r"(?:^|[|;&]\s*)(?:[\w./-]*/)?(?:grep|egrep|fgrep|rg)\b[^|;&]*$")
_TODO_OK = (
    "Todos have been modified successfully. Ensure that you continue to use the todo list to track your "
    "progress. Please proceed with the current tasks if applicable"
)


def _error(msg: str) -> ToolOutcome:
    return ToolOutcome(f"<tool_use_error>{msg}</tool_use_error>", True, f"Error: {msg}")


class ToolFailure(Exception):
    """An agent mistake inside a tool: becomes a ``<tool_use_error>`` result."""


def structured_patch(old: str, new: str, context: int = 3) -> list[dict[str, Any]]:
    """Claude Code's ``structuredPatch``: unified-diff hunks over the texts' ``\\n``-split lines."""
    a, b = old.split("\n"), new.split("\n")
    hunks = []
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        lines: list[str] = []
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                lines += [" " + s for s in a[x1:x2]]
                continue
            lines += ["-" + s for s in a[x1:x2]] + ["+" + s for s in b[y1:y2]]
        hunks.append(
            {"oldStart": i1 + 1, "oldLines": i2 - i1, "newStart": j1 + 1, "newLines": j2 - j1, "lines": lines}
        )
    return hunks


def _refusal_text(name: str, kind: str, detail: Any) -> str:
    """Claude Code's words for a `harness_base.refusal`."""
    if kind == "invalid":
        return f"InputValidationError: malformed tool call: {detail}"
    if kind == "unknown":
        return f"No such tool available: {name}"
    s = "s" if len(detail) > 1 else ""
    return f"InputValidationError: {name} failed due to the following issue{s}:\n" + "\n".join(detail)


def _clip(s: str) -> str:
    return s if len(s) <= 50 else s[:50] + "..."


def _duration(seconds: float) -> str:
    m, s = divmod(seconds, 60)
    return f"{int(m)}m {s:.1f}s" if m else f"{s:.1f}s"


class ClaudeCodeTools:
    """One rollout's Claude Code tools over ``sb`` (see the module docstring).

    Args:
        sb: a started sandbox; its ``workdir`` is the workspace the paths live under.
        tools: the tool names on offer (the system message lists them); other names get
            ``No such tool available``.
        require_read: enforce read-before-edit and modified-since-read, as Claude Code does.
    """

    def __init__(
        self, sb: Sandbox, *, tools: Sequence[str] = CLAUDE_TOOLS, require_read: bool = True
    ) -> None:
        self.sb, self.tools, self.require_read = sb, tuple(tools), require_read
        self.root = sb.workdir.rstrip("/")
        self.todos: list[Any] = []
        self._seen: dict[str, str] = {}  # workspace path -> its text when this harness last read or wrote it

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [CLAUDE_CODE_TOOLS[n] for n in self.tools]

    def call(self, name: str, args: Any, *, timeout: float = 120.0) -> ToolOutcome:
        """Run one tool call; ``timeout`` caps any command's wall clock. Agent mistakes become tool
        errors; `SandboxError` (an infrastructure failure) propagates."""
        refused = refusal(name, args, self.tools, CLAUDE_CODE_TOOLS)
        if refused is not None:
            return _error(_refusal_text(name, *refused))
        try:
            if name in ("Grep", "Glob", "LS"):
                return harness_search.run(self.sb, name, args, root=self.root, timeout=timeout)
            return getattr(self, "_" + name.lower())(args, timeout)
        except SandboxError:
            raise
        except ToolFailure as e:
            return _error(str(e))
        except HelperError as e:
            return _error(str(e))

    # ------------------------------------------------------------------ helpers
    def _rel(self, path: str, verb: str) -> str:
        rel = workspace_relpath(path, self.root)
        if rel == "":
            raise ToolFailure(f"EISDIR: illegal operation on a directory, {verb}")
        if rel is None:
            raise ToolFailure(f"Permission denied: {verb} {path} is outside the workspace ({self.root})")
        return rel

    def _abs(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def _load(self, rel: str, path: str) -> str | None:
        """The file's text, None when it does not exist."""
        try:
            return read_file(self.sb, rel).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise ToolFailure("EISDIR: illegal operation on a directory, read") from None
        except PermissionError:
            raise ToolFailure(
                f"Permission denied: {path} resolves outside the workspace ({self.root})"
            ) from None
        except (OSError, ValueError) as e:
            raise ToolFailure(f"{path}: {e}") from None

    def _check_read(self, rel: str, current: str) -> None:
        if not self.require_read:
            return
        if rel not in self._seen:
            raise ToolFailure("File has not been read yet. Read it first before writing to it.")
        if self._seen[rel] != current:
            raise ToolFailure(
                "File has been modified since read, either by the user or by a linter. "
                "Read it again before attempting to write it."
            )

    def _store(self, rel: str, text: str) -> None:
        try:
            self.sb.put(rel, text)
        except (OSError, ValueError) as e:
            raise ToolFailure(f"Permission denied: cannot write {self._abs(rel)}: {e}") from None
        self._seen[rel] = text

    # ------------------------------------------------------------------ tools
    def _bash(self, a: dict[str, Any], cap: float) -> ToolOutcome:
        cmd = a["command"]
        wanted = a["timeout"] / 1000 if a.get("timeout") else 120.0
        limit = max(min(wanted, 600.0, cap), 0.001)
        r = self.sb.exec(cmd, timeout=limit)
        out = r.output.rstrip("\n")
        result: dict[str, Any] = {"stdout": out, "stderr": "", "interrupted": r.timed_out, "isImage": False}
        result["noOutputExpected"] = False
        if r.timed_out:
            text = f"Command timed out after {_duration(limit)}" + (f"\n{out}" if out else "")
            return ToolOutcome(text, True, result, list(r.violations))
        if r.returncode == 1 and not out and _NO_MATCH_CMDS.search(cmd.strip()):
            result["returnCodeInterpretation"] = "No matches found"
            return ToolOutcome("", False, result, list(r.violations))
        if r.returncode != 0:
            text = f"Exit code {r.returncode}" + (f"\n{out}" if out else "")
            return ToolOutcome(text, True, f"Error: {text}", list(r.violations))
        return ToolOutcome(out, False, result, list(r.violations))

    def _read(self, a: dict[str, Any], _cap: float) -> ToolOutcome:
        rel = self._rel(a["file_path"], "read")
        text = self._load(rel, a["file_path"])
        if text is None:
            raise ToolFailure("File does not exist.")
        offset, limit = a.get("offset"), a.get("limit")
        size = len(text.encode())
        if size > MAX_READ_BYTES and offset is None and limit is None:
            raise ToolFailure(
                f"File content ({size / 1024:.1f}KB) exceeds maximum allowed size ({MAX_READ_BYTES // 1024}KB). "
                "Please use offset and limit parameters to read specific portions of the file, or use the "
                "GrepTool to search for specific content."
            )
        self._seen[rel] = text
        lines = text.split("\n")
        start = max(int(offset or 1), 1)
        window = lines[start - 1 : start - 1 + int(limit or READ_LINES)]
        file = {"filePath": self._abs(rel), "content": "\n".join(window), "numLines": len(window)}
        file |= {"startLine": start, "totalLines": len(lines)}
        if not text:
            shown = "<system-reminder>Warning: the file exists but the contents are empty.</system-reminder>"
        elif start > len(lines):
            shown = (
                f"<system-reminder>Warning: the file exists but is shorter than the provided offset ({start}). "
                f"The file has {len(lines)} lines.</system-reminder>"
            )
        else:
            shown = "\n".join(f"{start + i:>6}→{ln[:LINE_CHARS]}" for i, ln in enumerate(window))
        return ToolOutcome(shown, False, {"type": "text", "file": file})

    def _write(self, a: dict[str, Any], _cap: float) -> ToolOutcome:
        rel = self._rel(a["file_path"], "write")
        old = self._load(rel, a["file_path"])
        if old is not None:
            self._check_read(rel, old)
        self._store(rel, a["content"])
        path = self._abs(rel)
        if old is None:
            result = {"type": "create", "filePath": path, "content": a["content"], "structuredPatch": []}
            return ToolOutcome(
                f"File created successfully at: {path}", False, result | {"originalFile": None}
            )
        result = {"type": "update", "filePath": path, "content": a["content"]}
        result |= {"structuredPatch": structured_patch(old, a["content"]), "originalFile": old}
        return ToolOutcome(f"The file {path} has been updated successfully.", False, result)

    def _apply_edit(self, text: str, old: str, new: str, replace_all: bool) -> str:
        if old == new:
            raise ToolFailure("No changes to make: old_string and new_string are exactly the same.")
        count = text.count(old)
        if count == 0:
            raise ToolFailure(f"String to replace not found in file.\nString: {old}")
        if count > 1 and not replace_all:
            raise ToolFailure(
                f"Found {count} matches of the string to replace, but replace_all is false. To replace all "
                "occurrences, set replace_all to true. To replace only one occurrence, please provide more "
                f"context to uniquely identify the instance.\nString: {old}"
            )
        return text.replace(old, new) if replace_all else text.replace(old, new, 1)

    def _edit(self, a: dict[str, Any], _cap: float) -> ToolOutcome:
        rel = self._rel(a["file_path"], "edit")
        old_s, new_s, replace_all = a["old_string"], a["new_string"], bool(a.get("replace_all"))
        text = self._load(rel, a["file_path"])
        if text is None:
            if old_s:
                raise ToolFailure("File does not exist.")
            return self._write({"file_path": a["file_path"], "content": new_s}, _cap)
        if not old_s and text.strip():
            raise ToolFailure("Cannot create new file - file already exists.")
        self._check_read(rel, text)
        updated = new_s if not old_s else self._apply_edit(text, old_s, new_s, replace_all)
        self._store(rel, updated)
        path = self._abs(rel)
        shown = f"The file {path} has been updated successfully."
        if replace_all:
            shown = (
                f"The file {path} has been updated. All occurrences of '{old_s}' were successfully "
                f"replaced with '{new_s}'."
            )
        result = {"filePath": path, "oldString": old_s, "newString": new_s, "originalFile": text}
        result |= {"structuredPatch": structured_patch(text, updated), "userModified": False}
        return ToolOutcome(shown, False, result | {"replaceAll": replace_all})

    def _multiedit(self, a: dict[str, Any], _cap: float) -> ToolOutcome:
        rel = self._rel(a["file_path"], "edit")
        edits = [{**e, "replace_all": bool(e.get("replace_all"))} for e in a["edits"]]
        if not edits:
            raise ToolFailure("InputValidationError: MultiEdit needs at least one edit")
        text = self._load(rel, a["file_path"])
        if text is None:
            raise ToolFailure("File does not exist.")
        self._check_read(rel, text)
        updated = text
        for e in edits:
            updated = self._apply_edit(updated, e["old_string"], e["new_string"], e["replace_all"])
        self._store(rel, updated)
        path = self._abs(rel)
        lines = [
            f'{i}. Replaced "{_clip(e["old_string"])}" with "{_clip(e["new_string"])}"'
            for i, e in enumerate(edits, 1)
        ]
        shown = f"Applied {len(edits)} edit{'s' if len(edits) > 1 else ''} to {path}:\n" + "\n".join(lines)
        result: dict[str, Any] = {"filePath": path, "edits": edits, "originalFileContents": text}
        result |= {"structuredPatch": structured_patch(text, updated), "userModified": False}
        return ToolOutcome(shown, False, result)

    def _todowrite(self, a: dict[str, Any], _cap: float) -> ToolOutcome:
        old, self.todos = self.todos, list(a["todos"])
        return ToolOutcome(_TODO_OK, False, {"oldTodos": old, "newTodos": self.todos})
