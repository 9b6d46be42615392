"""The Codex CLI's tools over a `Sandbox`: ``shell``, ``apply_patch``, ``update_plan``, shaped as its logs.

What is covered (shapes read off real Codex rollouts and its documented tool contract):

- ``shell {"command": [argv...], "workdir", "timeout_ms"}`` runs the argv (usually ``["bash", "-lc",
  SCRIPT]``) in ``workdir`` (default the workspace root; 10 s default timeout, capped by the rollout)
  and answers ``{"output": ..., "metadata": {"exit_code": N, "duration_seconds": S}}`` as a JSON string;
  a timeout is exit code 124 with ``command timed out after N milliseconds``. An argv that invokes
  ``apply_patch`` (``["apply_patch", PATCH]``, or ``bash -lc`` with ``[cd DIR && ]apply_patch <<'EOF'``)
  is applied by the harness, as Codex does; a bare patch as the command is refused.
- ``apply_patch {"input": PATCH}`` (Codex's JSON tool variant): `datagen.apply_patch`. Success and
  write-time failures come back like a command (``Success. Updated the following files:`` / exit 1); a
  patch that does not parse or fit the files gets ``apply_patch verification failed: ...``; a path
  outside the workspace ``patch rejected: ...`` (nothing written in either case).
- ``update_plan {"explanation"?, "plan": [{"step", "status"}]}`` answers ``Plan updated``.
- Bad arguments: ``failed to parse function arguments: ...``; unknown tools: ``unsupported call: NAME``.

Codex sets no error flag on tool outputs; `ToolOutcome.is_error` is this harness's own reading
(non-zero exit, or one of the texts above), and the rollout log records only the output string (the
Codex ingester reads failures back from the exit code or those texts).
"""

from __future__ import annotations

import errno
import json
import shlex
import time
from collections.abc import Sequence
from typing import Any

from composer_replication.datagen import apply_patch as ap
from composer_replication.datagen.harness_base import ToolOutcome, read_file, refusal, workspace_relpath
from composer_replication.datagen.sandbox import Sandbox, SandboxError
from composer_replication.tool_schemas import CODEX_TOOLS

__all__ = ["CODEX_TOOL_NAMES", "CodexTools", "SandboxPatchFiles"]

CODEX_TOOL_NAMES = ("shell", "apply_patch", "update_plan")
DEFAULT_TIMEOUT_MS = 10_000
TIMEOUT_EXIT_CODE = 124
_STATUSES = ("pending", "in_progress", "completed")


class SandboxPatchFiles:
    """`apply_patch.PatchFiles` over a sandbox. Reads go through ``get``, which refuses a path whose
    symlinks lead out of the workspace; a write first asks ``get`` the same (so an ``Add File`` never
    follows a planted symlink, on any backend); removal runs ``rm`` on the checked relative path."""

    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb

    def read(self, path: str) -> str:
        return read_file(self.sb, path).decode("utf-8")

    def write(self, path: str, text: str) -> None:
        try:
            self.read(path)
        except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError):
            pass
        try:
            self.sb.put(path, text)
        except (PermissionError, ValueError) as e:
            raise PermissionError(errno.EACCES, str(e)) from None

    def remove(self, path: str) -> None:
        r = self.sb.exec(f"rm -- {shlex.quote(path)}", timeout=30)
        if not r.ok:
            out = r.output
            code = (
                errno.EISDIR
                if "Is a directory" in out
                else errno.ENOENT
                if "No such file" in out
                else errno.EACCES
            )
            raise OSError(code, out.strip())


def _exec_output(output: str, exit_code: int, duration: float) -> str:
    meta = {"exit_code": exit_code, "duration_seconds": round(duration, 1)}
    return json.dumps({"output": output, "metadata": meta}, ensure_ascii=False, separators=(",", ":"))


def _refusal_text(name: str, kind: str, detail: Any) -> str:
    """Codex's words for a `harness_base.refusal`."""
    if kind == "unknown":
        return f"unsupported call: {name}"
    return f"failed to parse function arguments: {detail if kind == 'invalid' else '; '.join(detail)}"


def _plain(text: str) -> ToolOutcome:
    return ToolOutcome(text, True, {"output": text})


class CodexTools:
    """One rollout's Codex tools over ``sb`` (see the module docstring)."""

    def __init__(self, sb: Sandbox, *, tools: Sequence[str] = CODEX_TOOL_NAMES) -> None:
        self.sb, self.tools = sb, tuple(tools)
        self.root = sb.workdir.rstrip("/")
        self.plan: list[Any] = []

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [CODEX_TOOLS[n] for n in self.tools]

    def call(self, name: str, args: Any, *, timeout: float = 600.0) -> ToolOutcome:
        """Run one call; ``timeout`` (s) caps a command's own ``timeout_ms``. `SandboxError` propagates."""
        refused = refusal(name, args, self.tools, CODEX_TOOLS)
        if refused is not None:
            return _plain(_refusal_text(name, *refused))
        if name == "shell":
            return self._shell(args, timeout)
        if name == "apply_patch":
            return self._patch(args["input"], "", time.monotonic())
        return self._update_plan(args)

    def _shell(self, a: dict[str, Any], cap: float) -> ToolOutcome:
        t0 = time.monotonic()
        argv = a["command"]
        if not argv or not all(isinstance(x, str) for x in argv):
            return _plain("failed to parse function arguments: command must be a non-empty list of strings")
        cwd = workspace_relpath(a.get("workdir") or self.root, self.root)
        if cwd is None:
            out = f"workdir {a.get('workdir')} is outside the workspace {self.root}: sandbox denied\n"
            return ToolOutcome(_exec_output(out, 1, 0.0), True, {"output": out, "exit_code": 1})
        try:
            found = ap.extract_invocation(argv)
        except ap.PatchError as e:
            return _plain(f"apply_patch verification failed: {e}")
        if found is not None:
            patch, cd = found
            joined = f"{cwd}/{cd}" if cwd and cd and not cd.startswith("/") else (cd or cwd)
            sub = workspace_relpath(joined, self.root)
            if sub is None:
                return _plain(ap.REJECTED)
            return self._patch(patch, sub, t0)
        ms = a.get("timeout_ms") or DEFAULT_TIMEOUT_MS
        limit = max(min(ms / 1000, cap), 0.001)
        where = shlex.quote(f"{self.root}/{cwd}" if cwd else self.root)
        r = self.sb.exec(f"cd {where} && {shlex.join(argv)}", timeout=limit)
        out, code = r.output, r.returncode
        if r.timed_out:
            out, code = f"command timed out after {int(limit * 1000)} milliseconds\n{out}", TIMEOUT_EXIT_CODE
        elapsed = time.monotonic() - t0
        result = {"output": out, "exit_code": code, "duration_seconds": round(elapsed, 1)}
        return ToolOutcome(_exec_output(out, code, elapsed), code != 0, result, list(r.violations))

    def _patch(self, patch: str, cwd: str, t0: float) -> ToolOutcome:
        try:
            summary = ap.apply_patch(patch, SandboxPatchFiles(self.sb), root=self.root, cwd=cwd)
        except SandboxError:
            raise
        except ap.PatchError as e:
            if e.stage == "rejected":
                return _plain(str(e))
            if e.stage == "verify":
                return _plain(f"apply_patch verification failed: {e}")
            out = f"{e}\n"
            elapsed = time.monotonic() - t0
            return ToolOutcome(_exec_output(out, 1, elapsed), True, {"output": out, "exit_code": 1})
        elapsed = time.monotonic() - t0
        return ToolOutcome(_exec_output(summary, 0, elapsed), False, {"output": summary, "exit_code": 0})

    def _update_plan(self, a: dict[str, Any]) -> ToolOutcome:
        for i, step in enumerate(a["plan"]):
            if not isinstance(step, dict) or not isinstance(step.get("step"), str):
                return _plain(f"failed to parse function arguments: plan[{i}] needs a string `step`")
            if step.get("status") not in _STATUSES:
                return _plain(
                    f"failed to parse function arguments: plan[{i}].status must be one of {', '.join(_STATUSES)}"
                )
        self.plan = list(a["plan"])
        return ToolOutcome("Plan updated", False, {"plan": self.plan, "explanation": a.get("explanation")})
