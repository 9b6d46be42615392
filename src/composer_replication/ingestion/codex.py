"""Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) -> the same states and examples.

Two line formats (notes: interfaces.md §2):

* current: ``{timestamp, type, payload}`` envelopes (``session_meta``, ``response_item``, ``event_msg``,
  ``turn_context``, ``compacted``);
* older rollouts: a bare session-meta object on the first line (``{id, timestamp, instructions, git}``), then
  bare Responses items (``{"type": "message" | "function_call" | ...}``) and ``{"record_type": "state"}`` lines.

Messages are taken from ``response_item`` only (``event_msg`` repeats them). One assistant turn is a maximal
run of model-side items (reasoning, assistant message, tool calls) between user-side items (user messages,
tool outputs). Codex never flags tool errors: failures are read from the exit code in the output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from composer_replication.ingestion._base import SessionIngester
from composer_replication.ingestion._reader import check_version, text_of
from composer_replication.ingestion._session import (
    Block,
    Event,
    IngestionStats,
    tool_error_meta,
)
from composer_replication.ingestion.claude_code import SYSTEM_PROMPT
from composer_replication.ingestion.errors import classify_error, detect_failure
from composer_replication.ingestion.redact import Redactor

__all__ = ["CodexIngester"]

TESTED_VERSIONS = ((0, 1, 0), (0, 128, 0))
_ENVELOPE_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})
_MODEL_ITEMS = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "web_search_call",
        "tool_search_call",
    }
)
_OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output", "local_shell_call_output"})
_BARE_ITEMS = _MODEL_ITEMS | _OUTPUT_ITEMS | {"message", "compaction", "ghost_snapshot"}


class CodexIngester(SessionIngester):
    """Convert a Codex CLI rollout into ``TraceState``s (one per model response) and ``TraceExample``s."""

    source = "codex"

    def __init__(
        self,
        *,
        system_prompt: str = SYSTEM_PROMPT,
        strip_thinking: bool = True,
        max_history_tokens: int | None = None,
        token_counter: Callable[[str], int] | None = None,
        redact: bool = True,
        redactor: Redactor | None = None,
        example_max_tokens: int = 8192,
        skip_sidechain: bool = True,
    ) -> None:
        self._setup(
            system_prompt=system_prompt,
            skip_sidechain=skip_sidechain,
            strip_thinking=strip_thinking,
            max_history_tokens=max_history_tokens,
            token_counter=token_counter,
            redact=redact,
            redactor=redactor,
            example_max_tokens=example_max_tokens,
        )

    def _conversations(
        self, path: Path, records: list[dict[str, Any]], stats: IngestionStats, seen: set[str] | None
    ) -> list[list[Any]]:
        items = self._items(path, records, stats)
        convs = [self._segments(items, stats)] if items is not None else []
        return [[s for s in c if s] for c in convs if any(c)]

    def _items(
        self, path: Path, records: list[dict[str, Any]], stats: IngestionStats
    ) -> list[dict[str, Any]] | None:
        """Normalise both formats to a list of Responses items (plus ``{"type": "_compacted"}`` markers)."""
        items: list[dict[str, Any]] = []
        used = 0
        for i, rec in enumerate(records):
            t = rec.get("type")
            payload = rec.get("payload")
            if not isinstance(t, (str, type(None))):
                self._bad_record(rec, stats, "type field of the wrong type")
                continue
            if t in _ENVELOPE_TYPES and isinstance(payload, dict):
                if t == "response_item":
                    items.append(payload)
                    used += 1
                elif t == "compacted":
                    items.append({"type": "_compacted", **payload})
                    stats.n_compactions += 1
                    used += 1
                elif t == "session_meta":
                    check_version(
                        payload.get("cli_version"),
                        *TESTED_VERSIONS,
                        "Codex CLI",
                        path,
                        stats.version_warnings,
                    )
                    src = payload.get("source")
                    if self.skip_sidechain and isinstance(src, dict) and "subagent" in src:
                        stats.skipped_subagent += len(records)
                        stats.n_records_skipped = stats.n_records_total
                        return None
                elif t == "event_msg" and payload.get("type") == "context_compacted":
                    pass
            elif rec.get("record_type") == "state":
                continue
            elif t in _BARE_ITEMS:
                items.append(rec)
                used += 1
            elif i == 0 and "id" in rec and "timestamp" in rec and t is None:
                check_version(
                    rec.get("cli_version"), *TESTED_VERSIONS, "Codex CLI", path, stats.version_warnings
                )
            elif t not in _ENVELOPE_TYPES:
                stats.n_unknown_types += 1
        stats.n_records_skipped = stats.n_records_total - used
        return items

    def _segments(self, items: list[dict[str, Any]], stats: IngestionStats) -> list[list[Event]]:
        segments: list[list[Event]] = [[]]
        calls: dict[str, Block] = {}
        current: Event | None = None  # the assistant turn being built
        for it in items:
            try:
                current = self._item(it, segments, calls, current, stats)
            except (TypeError, AttributeError, ValueError, KeyError, RecursionError) as exc:
                self._bad_record(it, stats, f"unusable {it.get('type')} item: {str(exc)[:80]}")
                current = None
        return segments

    def _item(
        self,
        it: dict[str, Any],
        segments: list[list[Event]],
        calls: dict[str, Block],
        current: Event | None,
        stats: IngestionStats,
    ) -> Event | None:
        """Add one Responses item; returns the assistant turn still open after it (or None)."""
        red = self.redactor.redact
        t = it.get("type")
        seg = segments[-1]
        if t == "_compacted":
            history = it.get("replacement_history")
            text = it.get("message") or ""
            if not text and isinstance(history, list):
                text = "\n\n".join(
                    f"{h.get('role', 'user')}: {text_of(h.get('content'))}"
                    for h in history
                    if isinstance(h, dict)
                )
            segments.append([Event("user", text=red(f"[COMPACTED CONTEXT]\n{text}"))])
            current = None
            return current
        if t == "message":
            role = it.get("role")
            text = text_of(it.get("content"))
            if role == "assistant":
                current = self._turn(current, seg, stats)
                assert current.blocks is not None
                stats.n_text_blocks += 1
                current.blocks.append(Block("text", red(text)))
            elif role == "user":
                current = None
                if text.strip():
                    seg.append(Event("user", text=red(text)))
            else:
                stats.n_meta_skipped += 1  # developer / system instructions
            return current
        if t in _MODEL_ITEMS:
            current = self._turn(current, seg, stats)
            assert current.blocks is not None
            if t == "reasoning":
                summary = it.get("summary")
                text = text_of(summary) if isinstance(summary, list) else ""
                stats.n_thinking_blocks += 1
                current.blocks.append(Block("thinking", red(text)))
                return current
            name, tool_input = _call(it)
            stats.n_tool_use_blocks += 1
            b = Block(
                "tool_use",
                name=name,
                input=self._tool_input(tool_input),
                id=str(it.get("call_id") or ""),
            )
            current.blocks.append(b)
            if b.id:
                calls[b.id] = b
            return current
        if t in _OUTPUT_ITEMS:
            current = None
            seg.append(self._tool_event(it, calls, stats))
        return current

    @staticmethod
    def _turn(current: Event | None, seg: list[Event], stats: IngestionStats) -> Event:
        if current is None:
            current = Event("assistant", blocks=[], key=str(len(seg)))
            seg.append(current)
        return current

    def _tool_event(self, it: dict[str, Any], calls: dict[str, Block], stats: IngestionStats) -> Event:
        stats.n_tool_results += 1
        cid = str(it.get("call_id") or "")
        call = calls.get(cid)
        if call is None:
            stats.n_orphan_tool_results += 1
        name = call.name if call else "unknown"
        raw = it.get("output")
        structured: Any = None
        if isinstance(raw, str) and raw.startswith("{"):
            try:
                structured = json.loads(raw)
            except ValueError:
                structured = None
        if isinstance(structured, dict) and "output" in structured:
            text = text_of(structured.get("output"))
        else:
            text = text_of(raw)
            structured = None
        failed, code = detect_failure(text, is_error_flag=False, structured=structured)
        red_text = self.redactor.redact(text)
        ev = Event(
            "tool", text=red_text, tool_name=name, tool_use_id=cid, tool_input=call.input if call else None
        )
        if failed:
            stats.n_tool_errors += 1
            kind = classify_error(text, exit_code=code)
            ev.error_kind = kind
            ev.error_meta = tool_error_meta(kind, name, red_text, ev.tool_input, code)
            ev.error = ev.error_meta["error_message"] or "(empty error output)"
        return ev


def _call(it: dict[str, Any]) -> tuple[str, Any]:
    t = it.get("type")
    if t == "function_call":
        args = it.get("arguments")
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = {"raw_arguments": args}
            args = parsed if isinstance(parsed, dict) else {"arguments": parsed}
        return str(it.get("name") or "unknown"), args if isinstance(args, dict) else {}
    if t == "custom_tool_call":
        return str(it.get("name") or "unknown"), {"input": it.get("input")}
    if t == "local_shell_call":
        action = it.get("action") or {}
        return "local_shell", {"command": action.get("command")} if isinstance(action, dict) else {}
    if t == "web_search_call":
        return "web_search", it.get("action") or {}
    return str(t), {k: v for k, v in it.items() if k not in ("type", "id", "status")}
