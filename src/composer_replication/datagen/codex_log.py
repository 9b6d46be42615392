"""Write a rollout as a Codex CLI rollout JSONL (``{timestamp, type, payload}`` lines), so the project's
Codex ingester reads it back like a real session.

Lines, in the order the CLI writes them: ``session_meta`` (id, cwd, originator, ...); the user-side
``<environment_context>`` message; per user turn a ``response_item`` user message, its ``event_msg``
``user_message`` echo and a ``turn_context``; per model turn ``response_item`` items (an assistant
``message`` with ``output_text``, ``function_call`` with JSON-string ``arguments`` and a ``call_id``) and
per tool call a ``function_call_output`` with the output string; cumulative ``event_msg`` ``token_count``
when token counts are known; the end as ``event_msg`` ``task_complete`` (the model stopped) or
``turn_aborted`` (a limit stopped it, ``reason`` = the limit).

The writer has the methods of the Claude Code writer (``rollout.SessionLog``): ``user``, ``assistant``,
``tool_result``, ``end``, ``close``. ``originator`` and ``cli_version`` say ``composer-replication``: the
file is this project's rollout, not a CLI recording.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from composer_replication._io import JsonlAppender

__all__ = ["CodexRolloutLog"]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class CodexRolloutLog:
    """Codex rollout JSONL at ``path`` (a partial file from an interrupted attempt is replaced)."""

    def __init__(self, path: Path, *, cwd: str = "/workspace", session_id: str | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self.path, self.cwd = path, cwd
        self.session_id = session_id or str(uuid.uuid4())
        self._out = JsonlAppender(path, fsync=False)
        self._model: str | None = None
        self._last_text = ""
        self._tokens = {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0}
        self._tokens |= {"reasoning_output_tokens": 0, "total_tokens": 0}
        meta: dict[str, Any] = {
            "id": self.session_id,
            "timestamp": _now(),
            "cwd": cwd,
            "originator": "composer-replication",
        }
        meta |= {"cli_version": "composer-replication", "instructions": None, "source": "exec"}
        self._line("session_meta", meta | {"model_provider": "composer-replication"})
        env = (
            f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <approval_policy>never</approval_policy>\n"
            "  <sandbox_mode>workspace-write</sandbox_mode>\n  <network_access>restricted</network_access>\n"
            "  <shell>bash</shell>\n</environment_context>"
        )
        self._item({"type": "message", "role": "user", "content": [{"type": "input_text", "text": env}]})

    def _line(self, kind: str, payload: dict[str, Any]) -> None:
        self._out.write({"timestamp": _now(), "type": kind, "payload": payload})

    def _item(self, payload: dict[str, Any]) -> None:
        self._line("response_item", payload)

    def user(self, text: str) -> None:
        self._item({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        self._line("event_msg", {"type": "user_message", "message": text, "images": []})

    def assistant(
        self, blocks: list[dict[str, Any]], model: str, usage: dict[str, int] | None = None
    ) -> None:
        """One model turn: ``blocks`` as `rollout._split_blocks` makes them (``text`` / ``tool_use``)."""
        if model != self._model:
            self._model = model
            ctx = {"cwd": self.cwd, "approval_policy": "never", "model": model, "summary": "auto"}
            self._line(
                "turn_context", ctx | {"sandbox_policy": {"mode": "workspace-write", "network_access": False}}
            )
        for b in blocks:
            if b["type"] == "text":
                self._last_text = b["text"]
                content = [{"type": "output_text", "text": b["text"]}]
                self._item({"type": "message", "role": "assistant", "content": content})
                self._line("event_msg", {"type": "agent_message", "message": b["text"]})
            elif b["type"] == "tool_use":
                args = json.dumps(b["input"], ensure_ascii=False, separators=(",", ":"))
                self._item(
                    {"type": "function_call", "name": b["name"], "arguments": args, "call_id": b["id"]}
                )
        if usage:
            inp, out = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
            last = {"input_tokens": inp, "cached_input_tokens": 0, "output_tokens": out}
            last |= {"reasoning_output_tokens": 0, "total_tokens": inp + out}
            for k, v in last.items():
                self._tokens[k] += v
            info = {"total_token_usage": dict(self._tokens), "last_token_usage": last}
            self._line("event_msg", {"type": "token_count", "info": info, "rate_limits": None})

    def tool_result(self, tool_use_id: str, content: str, is_error: bool, tool_use_result: Any) -> None:
        """The call's output string (Codex records no error flag and no structured result)."""
        self._item({"type": "function_call_output", "call_id": tool_use_id, "output": content})

    def end(self, reason: str) -> None:
        if reason == "done":
            self._line("event_msg", {"type": "task_complete", "last_agent_message": self._last_text or None})
        else:
            self._line("event_msg", {"type": "turn_aborted", "reason": reason})

    def close(self) -> None:
        self._out.close()
