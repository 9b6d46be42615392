"""What is known about a session file before it is parsed (format, start, project, session id), and the
``--since/--until/--project/--session`` filters and the trivial-session test applied with it."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from itertools import islice
from pathlib import Path
from typing import Any

from composer_replication.ingestion import _json
from composer_replication.ingestion._files import iter_lines

_CODEX_HINTS = (b'"session_meta"', b'"response_item"', b'"event_msg"', b'"turn_context"', b'"record_type"')


def detect_format(path: Path, head: bytes) -> str:
    """``"codex"`` or ``"claude_code"``, from the first lines of the file (then its name)."""
    for line in islice(iter_lines(head), 20):
        if any(h in line for h in _CODEX_HINTS):
            return "codex"
        if b'"parentUuid"' in line or b'"sessionId"' in line or b'"leafUuid"' in line:
            return "claude_code"
        if line.startswith(b'{"id"') and b'"instructions"' in line:
            return "codex"
    return "codex" if path.name.startswith("rollout-") or ".codex" in path.parts else "claude_code"


def head_info(path: Path, head: bytes) -> dict[str, Any]:
    """``{"format", "first_ts", "session_id", "cwd"}`` from the first 64 KiB (fields missing when not there)."""
    fmt = detect_format(path, head)
    info: dict[str, Any] = {"format": fmt, "first_ts": ""}
    for line in iter_lines(head):
        try:
            rec = _json.loads(line)
        except (_json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            continue
        if not isinstance(rec, dict):
            continue
        src: dict[str, Any] = (
            rec["payload"] if fmt == "codex" and isinstance(rec.get("payload"), dict) else rec
        )
        ts = rec.get("timestamp")
        if not info["first_ts"] and isinstance(ts, str):
            info["first_ts"] = ts
        sid = (
            src.get("id")
            if fmt == "codex" and rec.get("type") in ("session_meta", None)
            else src.get("sessionId")
        )
        if "session_id" not in info and isinstance(sid, str):
            info["session_id"] = sid
        if "cwd" not in info and isinstance(src.get("cwd"), str):
            info["cwd"] = src["cwd"]
        if info["first_ts"] and "session_id" in info and "cwd" in info:
            break
    return info


def project_dir(path: Path) -> Path:
    """The Claude Code project folder of a session or subagent transcript (``<project>/<sid>/subagents/x``)."""
    return path.parent.parent.parent if path.parent.name == "subagents" else path.parent


def _when(value: str | _dt.datetime | _dt.date | None, *, end: bool) -> _dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        d = value
    elif isinstance(value, _dt.date):
        d = _dt.datetime(value.year, value.month, value.day)
        return _utc(d + _dt.timedelta(days=1) if end else d)
    else:
        text = str(value).strip()
        try:
            d = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"{text!r}: not a date or time (use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS][Z])"
            ) from None
        if len(text) == 10 and end:  # a whole day: --until 2026-01-31 includes that day
            d += _dt.timedelta(days=1)
    return _utc(d)


def _utc(d: _dt.datetime) -> _dt.datetime:
    return d.replace(tzinfo=_dt.UTC) if d.tzinfo is None else d.astimezone(_dt.UTC)


@dataclass
class Filters:
    """Which sessions to ingest (all of them by default)."""

    since: _dt.datetime | None = None
    until: _dt.datetime | None = None  # exclusive
    projects: list[str] = field(default_factory=list)  # globs
    sessions: list[str] = field(default_factory=list)  # ids or id prefixes

    @classmethod
    def make(cls, since: Any = None, until: Any = None, project: Any = None, session: Any = None) -> Filters:
        as_list = lambda v: [] if v is None else [v] if isinstance(v, str) else list(v)  # noqa: E731
        return cls(_when(since, end=False), _when(until, end=True), as_list(project), as_list(session))

    def active(self) -> bool:
        return bool(self.since or self.until or self.projects or self.sessions)

    def describe(self) -> dict[str, Any]:
        return {"since": self.since, "until": self.until, "project": self.projects, "session": self.sessions}

    def keep(self, path: Path, info: dict[str, Any]) -> bool:
        if self.since or self.until:
            try:
                start = _utc(_dt.datetime.fromisoformat(info.get("first_ts", "").replace("Z", "+00:00")))
            except ValueError:
                return False  # no start time: it cannot be placed in the window
            if (self.since and start < self.since) or (self.until and start >= self.until):
                return False
        if self.projects:
            cwd = info.get("cwd") or ""
            names = [cwd, Path(cwd).name, project_dir(path).name] if cwd else [project_dir(path).name]
            if not any(fnmatchcase(n, g) for g in self.projects for n in names if n):
                return False
        if self.sessions:
            ids = [path.stem, info.get("session_id") or ""]
            if not any(i and i.startswith(s) or s in path.stem for s in self.sessions for i in ids):
                return False
        return True


def is_trivial(trace: Any) -> bool:
    """A session with nothing to learn from: no assistant turn, or only the CLI's "Warmup" exchange."""
    if not trace.states:
        return True
    users = [t["content"].strip().lower() for t in trace.turns if t["role"] == "user"]
    return bool(users) and all(u == "warmup" for u in users)
