"""Write a rollout as a Claude Code session JSONL, so the project's Claude Code ingester reads it back like
a real session: one record per content block (records of one model turn share ``message.id`` and
``requestId``), chained by ``parentUuid``; tool results as ``user`` records with ``tool_result`` blocks
(``is_error``) and the tool's ``toolUseResult``; the end as a display-only ``system`` record
(``subtype: "rollout_end"``). ``version`` and ``entrypoint`` say ``composer-replication``: the file is this
project's rollout, not a CLI recording. `codex_log.CodexRolloutLog` has the same methods.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from composer_replication._io import JsonlAppender

__all__ = ["SessionLog"]


class SessionLog:
    """Writes a Claude Code session JSONL (one record per content block, chained by ``parentUuid``)."""

    def __init__(self, path: Path, *, cwd: str = "/workspace", session_id: str | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a partial log from an interrupted attempt is redone, not appended to
        self.path, self.cwd = path, cwd
        self.session_id = session_id or str(uuid.uuid4())
        self._out = JsonlAppender(path, fsync=False)
        self._parent: str | None = None

    def _write(self, rtype: str, message: dict[str, Any] | None, **extra: Any) -> str:
        rid = str(uuid.uuid4())
        self._out.write(
            {
                "type": rtype,
                "uuid": rid,
                "parentUuid": self._parent,
                "isSidechain": False,
                "userType": "external",
                "entrypoint": "composer-replication-rollout",
                "sessionId": self.session_id,
                "cwd": self.cwd,
                "version": "composer-replication",
                "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
                **({"message": message} if message is not None else {}),
                **extra,
            }
        )
        self._parent = rid
        return rid

    def user(self, text: str) -> None:
        self._write("user", {"role": "user", "content": text})

    def assistant(
        self, blocks: list[dict[str, Any]], model: str, usage: dict[str, int] | None = None
    ) -> None:
        """One model turn, a record per block sharing ``message.id``; ``usage`` (``input_tokens``,
        ``output_tokens``) goes on the last record, as Claude Code writes the full count there."""
        msg_id, n = f"msg_{uuid.uuid4().hex[:24]}", len(blocks)
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        for i, block in enumerate(blocks):
            last = i == n - 1
            message: dict[str, Any] = {
                "id": msg_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [block],
            }
            message |= {"stop_reason": stop if last else None, "stop_sequence": None}
            message["usage"] = {"input_tokens": 0, "output_tokens": 0} | (dict(usage or {}) if last else {})
            self._write("assistant", message, requestId=f"req_{msg_id[4:]}")

    def tool_result(self, tool_use_id: str, content: str, is_error: bool, tool_use_result: Any) -> None:
        block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": is_error}
        self._write("user", {"role": "user", "content": [block]}, toolUseResult=tool_use_result)

    def end(self, reason: str) -> None:
        """A display-only ``system`` record saying why the rollout ended (``harness.END_REASONS``)."""
        self._write("system", None, subtype="rollout_end", content=f"Rollout ended: {reason}", level="info")

    def close(self) -> None:
        self._out.close()
