"""Builders for the mining tests: real git repositories and session logs in the real Claude Code and Codex
formats (the record shapes of the bundled genuine sessions; interfaces.md §1-2)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

_n = itertools.count()
CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n"
TEST_CALC = (
    "from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_sub():\n    assert sub(5, 3) == 2\n"
)


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    e = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com"}
    e |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com", **(env or {})}
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=e, check=True)
    return r.stdout.strip()


def make_repo(path: Path, files: dict[str, str] | None = None, *, date: str | None = None) -> str:
    """A git repository at ``path`` with ``files`` committed on ``main``; returns the commit."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    return commit(
        path, files if files is not None else {"calc.py": CALC, "test_calc.py": TEST_CALC}, date=date
    )


def commit(path: Path, files: dict[str, str], msg: str = "change", *, date: str | None = None) -> str:
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    git(path, "add", "-A")
    env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date} if date else None
    git(path, "commit", "-q", "-m", msg, env=env)
    return git(path, "rev-parse", "HEAD")


def set_reflog_times(repo: Path, times: list[float]) -> None:
    """Rewrite HEAD's reflog entries (oldest first) to the given unix times (when HEAD moved)."""
    log = repo / ".git" / "logs" / "HEAD"
    out = []
    for line, t in zip(log.read_text().splitlines(), times, strict=True):
        head, _, msg = line.partition("\t")
        parts = head.split(" ")
        parts[-2] = str(int(t))
        out.append(" ".join(parts) + "\t" + msg)
    log.write_text("\n".join(out) + "\n")


def now(offset_s: float = 0.0) -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset_s)


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class ClaudeSession:
    """A Claude Code transcript: records chained by parentUuid, one content block per assistant record."""

    def __init__(
        self, cwd: str, session_id: str = "", *, start: dt.datetime | None = None, branch: str = "main"
    ):
        self.cwd, self.branch = cwd, branch
        self.sid = session_id or f"5e55{next(_n):04d}-0000-4000-8000-000000000000"
        self.t = start or now(5)
        self.records: list[dict[str, Any]] = []
        self.last: str | None = None

    def _rec(self, type_: str, message: dict[str, Any], **kw: Any) -> dict[str, Any]:
        self.t += dt.timedelta(seconds=1)
        rec = {
            "parentUuid": self.last, "isSidechain": False, "userType": "external", "cwd": self.cwd,
            "sessionId": self.sid, "version": "2.1.220", "gitBranch": self.branch, "type": type_,
            "message": message, "uuid": f"{next(_n):08d}-aaaa-4bbb-8ccc-dddddddddddd", "timestamp": iso(self.t),
            **kw,
        }  # fmt: skip
        self.records.append(rec)
        self.last = rec["uuid"]
        return rec

    def user(self, text: str) -> ClaudeSession:
        self._rec("user", {"role": "user", "content": text})
        return self

    def call(
        self, name: str, inp: dict[str, Any], output: str, *, error: bool = False, tur: Any = None
    ) -> str:
        tid = f"toolu_{next(_n):08d}"
        mid = f"msg_{next(_n):08d}"
        block = {"type": "tool_use", "id": tid, "name": name, "input": inp}
        self._rec(
            "assistant",
            {"id": mid, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [block],
             "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 5}},
            requestId=f"req_{mid}",
        )  # fmt: skip
        result = {"type": "tool_result", "tool_use_id": tid, "content": output}
        if error:
            result["is_error"] = True
        self._rec("user", {"role": "user", "content": [result]}, toolUseResult=tur if tur is not None else {})
        return tid

    def bash(self, command: str, output: str = "", *, exit_code: int = 0) -> ClaudeSession:
        text = output if exit_code == 0 else f"Error: Exit code {exit_code}\n{output}"
        self.call("Bash", {"command": command, "description": "run"}, text, error=exit_code != 0,
                  tur={"stdout": output, "stderr": "", "interrupted": False, "isImage": False})  # fmt: skip
        return self

    def edit(self, path: str, old: str, new: str, *, ok: bool = True) -> ClaudeSession:
        inp = {"file_path": path, "old_string": old, "new_string": new, "replace_all": False}
        if ok:
            self.call(
                "Edit", inp, f"The file {path} has been updated.", tur={"filePath": path, "oldString": old}
            )
        else:
            self.call("Edit", inp, "<tool_use_error>String to replace not found in file.</tool_use_error>",
                      error=True, tur="Error: String to replace not found in file.")  # fmt: skip
        return self

    def read(self, path: str, content: str) -> ClaudeSession:
        """A Read call whose output shows ``content`` the way Claude Code numbers lines."""
        shown = "\n".join(f"{i:>6}\u2192{line}" for i, line in enumerate(content.split("\n"), 1))
        self.call(
            "Read",
            {"file_path": path},
            shown,
            tur={"type": "text", "file": {"filePath": path, "content": content}},
        )
        return self

    def write(self, path: str, content: str) -> ClaudeSession:
        self.call("Write", {"file_path": path, "content": content}, f"File created successfully at: {path}")
        return self

    def multiedit(self, path: str, edits: list[tuple[str, str]]) -> ClaudeSession:
        inp = {"file_path": path, "edits": [{"old_string": o, "new_string": n} for o, n in edits]}
        self.call("MultiEdit", inp, f"Applied {len(edits)} edits to {path}")
        return self

    def say(self, text: str) -> ClaudeSession:
        mid = f"msg_{next(_n):08d}"
        self._rec("assistant", {"id": mid, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn"})  # fmt: skip
        return self

    def interrupt(self) -> ClaudeSession:
        self._rec(
            "user", {"role": "user", "content": [{"type": "text", "text": "[Request interrupted by user]"}]}
        )
        return self

    def save(self, root: Path) -> Path:
        folder = root / "projects" / self.cwd.replace("/", "-")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.sid}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        return path


class CodexSession:
    """A Codex CLI rollout: session_meta, then response_item lines (shell calls, apply_patch heredocs)."""

    def __init__(self, cwd: str, *, start: dt.datetime | None = None, session_id: str = ""):
        self.cwd = cwd
        self.sid = session_id or f"019a93b9-{next(_n):04d}-7600-98ff-940e6b99603c"
        self.t = start or now(5)
        self.lines: list[dict[str, Any]] = []
        self._line("session_meta", {"id": self.sid, "timestamp": iso(self.t), "cwd": cwd,
                                    "originator": "codex_cli_rs", "cli_version": "0.58.0", "instructions": None,
                                    "git": {"branch": "main"}})  # fmt: skip

    def _line(self, type_: str, payload: dict[str, Any]) -> None:
        self.t += dt.timedelta(seconds=1)
        self.lines.append({"timestamp": iso(self.t), "type": type_, "payload": payload})

    def user(self, text: str) -> CodexSession:
        self._line(
            "response_item",
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        )
        return self

    def shell(self, command: str, output: str = "", *, exit_code: int = 0, workdir: str = "") -> CodexSession:
        cid = f"call_{next(_n):08d}"
        args = {"command": ["bash", "-lc", command], "workdir": workdir or self.cwd}
        self._line(
            "response_item",
            {"type": "function_call", "name": "shell", "arguments": json.dumps(args), "call_id": cid},
        )
        out = {"output": output, "metadata": {"exit_code": exit_code, "duration_seconds": 0.1}}
        self._line(
            "response_item", {"type": "function_call_output", "call_id": cid, "output": json.dumps(out)}
        )
        return self

    def apply_patch(self, patch: str, *, ok: bool = True) -> CodexSession:
        body = f"apply_patch <<'PATCH'\n*** Begin Patch\n{patch.rstrip()}\n*** End Patch\nPATCH\n"
        out = "Success. Updated the following files:\nM x\n" if ok else "error: patch did not apply"
        return self.shell(body, out, exit_code=0 if ok else 1)

    def save(self, root: Path) -> Path:
        day = self.t.strftime("%Y/%m/%d")
        folder = root / "sessions" / day
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rollout-{self.t.strftime('%Y-%m-%dT%H-%M-%S')}-{self.sid}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in self.lines))
        return path


def fix_session(repo: Path, *, tests_cmd: str = "python -m pytest -q test_calc.py") -> ClaudeSession:
    """The passing case: a failing test run, the fix, the tests passing."""
    s = ClaudeSession(str(repo))
    s.user("sub() adds instead of subtracting; please fix it")
    s.bash(tests_cmd, "1 failed, 1 passed", exit_code=1)
    s.edit(f"{repo}/calc.py", "def sub(a, b):\n    return a + b", "def sub(a, b):\n    return a - b")
    s.bash(tests_cmd, "2 passed")
    s.say("Fixed: sub now subtracts.")
    return s
