"""Tiny writers of Claude Code / Codex records in the shapes documented in interfaces.md §1–2."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

_n = itertools.count()


def uid(prefix: str = "u") -> str:
    return f"{prefix}-{next(_n):06d}-0000-4000-8000-000000000000"


class CC:
    """Build a Claude Code session as a list of records chained by parentUuid."""

    def __init__(self, session: str = "sess-1", version: str = "2.1.38") -> None:
        self.records: list[dict[str, Any]] = []
        self.session, self.version = session, version
        self.last: str | None = None

    def _env(self, type_: str, parent: str | None = "__last__", **kw: Any) -> dict[str, Any]:
        rec = {
            "parentUuid": self.last if parent == "__last__" else parent,
            "isSidechain": False,
            "type": type_,
            "uuid": uid(),
            "sessionId": self.session,
            "version": self.version,
            "timestamp": f"2026-01-01T00:00:{len(self.records):02d}.000Z",
            **kw,
        }
        self.records.append(rec)
        self.last = rec["uuid"]
        return rec

    def user(self, text: str, **kw: Any) -> dict[str, Any]:
        return self._env("user", message={"role": "user", "content": text}, **kw)

    def assistant(
        self, blocks: list[dict[str, Any]], msg_id: str | None = None, **kw: Any
    ) -> list[dict[str, Any]]:
        """One API response, written one block per record (as the CLI does)."""
        mid = msg_id or f"msg_{next(_n):06d}"
        out = []
        for b in blocks:
            out.append(
                self._env(
                    "assistant",
                    message={
                        "id": mid,
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-x",
                        "content": [b],
                    },
                    requestId="req_" + mid,
                    **kw,
                )
            )
        return out

    def tool_result(
        self, tool_use_id: str, content: Any, *, is_error: bool | None = None, tur: Any = None, **kw: Any
    ):
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
        if is_error is not None:
            block["is_error"] = is_error
        extra = {"toolUseResult": tur} if tur is not None else {}
        return self._env("user", message={"role": "user", "content": [block]}, **extra, **kw)

    def write(self, path: Path, tail: bytes = b"") -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            for r in self.records:
                fh.write(json.dumps(r).encode() + b"\n")
            fh.write(tail)
        return path


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def tool_use(name: str, inp: dict[str, Any], tid: str | None = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid or f"toolu_{next(_n):06d}", "name": name, "input": inp}


def thinking(t: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": t, "signature": "sig"}


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
