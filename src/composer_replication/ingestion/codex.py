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
from pathlib import Path
from typing import Any

from composer_replication.ingestion._base import AssemblyInputs, SessionIngester, mark_failure
from composer_replication.ingestion._reader import check_version, text_of
from composer_replication.ingestion._session import (
    Block,
    Conversation,
    Event,
    IngestionStats,
    tool_error_meta,
)

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

    # -- phase 1: one line -> one item ------------------------------------------------------------------

    def parse_record(
        self, rec: dict[str, Any], stats: IngestionStats, ctx: dict[str, Any]
    ) -> dict[str, Any] | None:
        t = rec.get("type")
        payload = rec.get("payload")
        if t == "response_item" and type(payload) is dict:  # the common line, first
            ctx["seen"] = True
            return self._response_item(payload, rec.get("timestamp"))
        first = not ctx.get("seen")
        ctx["seen"] = True
        if not isinstance(t, (str, type(None))):
            raise ValueError("type field of the wrong type")
        if t in _ENVELOPE_TYPES and isinstance(payload, dict):
            if t == "response_item":
                return self._response_item(payload, rec.get("timestamp"))
            if t == "compacted":
                text = payload.get("message") or ""
                history = payload.get("replacement_history")
                if not text and isinstance(history, list):
                    text = "\n\n".join(
                        f"{h.get('role', 'user')}: {text_of(h.get('content'))}"
                        for h in history
                        if isinstance(h, dict)
                    )
                return {"t": "cmp", "tx": self.redactor.redact(f"[COMPACTED CONTEXT]\n{text}")}
            if t == "session_meta":
                return self._meta(payload, stats, ctx)
            if t == "event_msg" and payload.get("type") == "token_count":
                info = payload.get("info")
                tot = info.get("total_token_usage") if isinstance(info, dict) else None
                if isinstance(tot, dict):
                    return {"t": "tok", "v": {k: tot[k] for k in _TOKEN_KEYS if isinstance(tot.get(k), int)}}
            stats.n_display_only += 1  # event_msg repeats response items; turn_context is per-turn settings
            return None
        if rec.get("record_type") == "state":
            return None
        if t in _BARE_ITEMS:
            return self._response_item(rec, rec.get("timestamp"))
        if first and "id" in rec and "timestamp" in rec and t is None:
            return self._meta(rec, stats, ctx)
        if t not in _ENVELOPE_TYPES:
            stats.n_unknown_types += 1
        return None

    def _meta(self, payload: dict[str, Any], stats: IngestionStats, ctx: dict[str, Any]) -> dict[str, Any]:
        assert stats.version_warnings is not None  # IngestionStats.__post_init__
        check_version(
            payload.get("cli_version"),
            *TESTED_VERSIONS,
            "Codex CLI",
            ctx.get("file", "rollout"),
            stats.version_warnings,
        )
        it: dict[str, Any] = {"t": "meta"}
        for src, dst in (
            ("id", "session_id"),
            ("cwd", "cwd"),
            ("timestamp", "ts"),
            ("cli_version", "version"),
        ):
            if isinstance(payload.get(src), str):
                it[dst] = self.redactor.redact(payload[src]) if dst == "cwd" else payload[src]
        source = payload.get("source")
        if isinstance(source, dict) and "subagent" in source:
            sub = source["subagent"]
            it["sub"] = self._tool_input(sub) if isinstance(sub, (dict, str)) else True
        return it

    def _response_item(self, p: dict[str, Any], ts: Any) -> dict[str, Any] | None:
        red = self.redactor.redact
        t = p.get("type")
        if t == "message":
            role = p.get("role")
            text = text_of(p.get("content"))
            if role == "assistant":
                return {"t": "at", "tx": red(text)}
            kind = "developer" if role != "user" else _context_kind(text)
            if kind:
                return {"t": "c", "c": kind, "tx": red(text)} if text.strip() else None
            it = {"t": "u", "tx": red(text)}
            if isinstance(ts, str):
                it["ts"] = ts
            return it
        if t == "reasoning":
            summary = p.get("summary")
            return {"t": "ah", "tx": red(text_of(summary) if isinstance(summary, list) else "")}
        if t in _MODEL_ITEMS:
            name, tool_input = _call(p)
            return {
                "t": "au",
                "n": name,
                "i": self._tool_input(tool_input),
                "id": str(p.get("call_id") or ""),
            }
        if t in _OUTPUT_ITEMS:
            return self._output(p)
        return None

    def _output(self, p: dict[str, Any]) -> dict[str, Any]:
        raw = p.get("output")
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
        it: dict[str, Any] = {"t": "r", "id": str(p.get("call_id") or ""), "tx": self.redactor.redact(text)}
        flagged = structured is None and text.startswith(_ERROR_PREFIXES)
        return mark_failure(it, text, is_error_flag=flagged, structured=structured)

    # -- phase 2: items -> one conversation -----------------------------------------------------------------

    def assemble(
        self, path: Path, items: list[dict[str, Any]], stats: IngestionStats, inputs: AssemblyInputs
    ) -> list[Conversation]:
        meta: dict[str, Any] = {}
        for it in items:
            if it["t"] == "meta":
                if "sub" in it and self.skip_sidechain:
                    stats.skipped_subagent += len(items)
                    return []
                for k in ("session_id", "cwd", "version"):
                    if k in it:
                        meta.setdefault(k, it[k])
                if "sub" in it:
                    meta["parent"] = it["sub"]
                    meta["sidechain"] = True
        segments: list[list[Event]] = [[]]
        calls: dict[str, Block] = {}
        current: Event | None = None  # the assistant turn being built
        ts = [it["ts"] for it in items if "ts" in it]
        usage = None
        for it in items:
            t = it["t"]
            seg = segments[-1]
            if t == "tok":
                usage = it["v"]
                continue
            if t == "meta":
                continue
            stats.n_records_used += 1
            if t == "cmp":
                stats.n_compactions += 1
                segments.append([Event("user", text=it["tx"])])
                current = None
            elif t == "u":
                current = None
                if it["tx"].strip():
                    seg.append(Event("user", text=it["tx"], ts=it.get("ts", "")))
            elif t == "c":
                stats.n_context += 1
                if it["c"] != "developer":
                    current = None
                seg.append(Event("context", text=it["tx"], context_kind=it["c"]))
            elif t in ("at", "ah", "au"):
                current = self._turn(current, seg)
                assert current.blocks is not None
                if t == "at":
                    stats.n_text_blocks += 1
                    current.blocks.append(Block("text", it["tx"]))
                elif t == "ah":
                    stats.n_thinking_blocks += 1
                    current.blocks.append(Block("thinking", it["tx"]))
                else:
                    stats.n_tool_use_blocks += 1
                    b = Block("tool_use", name=it["n"], input=it["i"], id=it["id"])
                    current.blocks.append(b)
                    if b.id:
                        calls[b.id] = b
            elif t == "r":
                current = None
                seg.append(self._tool_event(it, calls, stats))
        if ts:
            meta.update(start=min(ts), end=max(ts))
        if usage:
            meta["usage"] = usage
        conv = Conversation([s for s in segments if s], "", meta)
        return [conv] if conv.segments else []

    @staticmethod
    def _turn(current: Event | None, seg: list[Event]) -> Event:
        if current is None:
            current = Event("assistant", blocks=[], key=str(len(seg)))
            seg.append(current)
        return current

    def _tool_event(self, it: dict[str, Any], calls: dict[str, Block], stats: IngestionStats) -> Event:
        stats.n_tool_results += 1
        call = calls.get(it["id"])
        if call is None:
            stats.n_orphan_tool_results += 1
        name = call.name if call else "unknown"
        ev = Event(
            "tool",
            text=it["tx"],
            tool_name=name,
            tool_use_id=it["id"],
            tool_input=call.input if call else None,
        )
        if it.get("f"):
            stats.n_tool_errors += 1
            ev.error_kind = it["ek"]
            ev.error_meta = tool_error_meta(it["ek"], name, it["tx"], ev.tool_input, it.get("c"))
            ev.error = ev.error_meta["error_message"] or "(empty error output)"
        return ev


# What Codex answers a call that failed before running (no exit code to read): a patch that does not
# parse or fit, a path it refuses, an unknown tool, arguments that do not parse.
_ERROR_PREFIXES = (
    "apply_patch verification failed",
    "patch rejected:",
    "unsupported call:",
    "failed to parse function arguments",
)
_TOKEN_KEYS = (
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_output_tokens",
    "total_tokens",
)
_CONTEXT_PREFIXES = (
    ("<environment_context>", "environment"),
    ("<user_instructions>", "instructions"),
    ("# AGENTS.md instructions", "instructions"),
    ("<INSTRUCTIONS>", "instructions"),
)


def _context_kind(text: str) -> str:
    """User-role messages the harness writes (environment, AGENTS.md): context, not the user's own words."""
    head = text.lstrip()[:40]
    return next((kind for prefix, kind in _CONTEXT_PREFIXES if head.startswith(prefix)), "")


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
