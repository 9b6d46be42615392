"""Claude Code session JSONL -> ``TraceState`` stream (one state per assistant turn) and ``TraceExample`` rows.

The format is unspecified and changes between CLI versions (notes: interfaces.md §1). What this parser does:

* one API response is written as several ``assistant`` lines sharing ``message.id``: they are merged into
  one turn (one ``TraceState``); parallel tool calls that fork the ``parentUuid`` tree are kept;
* the active branch of an edited/rewound session is found by walking ``parentUuid`` up from the last turn
  (through ``logicalParentUuid`` at compaction boundaries); other branches are dropped and counted;
* records repeated by a resumed session are dropped by ``uuid`` (pass ``seen_uuids`` to share across files);
* ``compact_boundary`` starts a new segment whose history opens with the compaction summary;
* synthetic API-error records, ``isMeta`` injections, bookkeeping and unknown record types never reach the
  history; sidechains (inline ``isSidechain``, ``agent-*.jsonl`` files, ``subagents/`` folders) are skipped by
  default, or become conversations of their own with ``skip_sidechain=False``;
* tool results are paired with their calls; failures (``is_error``, ``<tool_use_error>``, a non-zero exit
  code without the flag) become error sites with an ``error_kind``.
"""

from __future__ import annotations

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
from composer_replication.ingestion.errors import classify_error, detect_failure
from composer_replication.ingestion.redact import Redactor
from composer_replication.wire import SYSTEM_PROMPT  # the agent's system message (one wire format)

__all__ = ["SYSTEM_PROMPT", "ClaudeCodeIngester", "IngestionStats"]


TESTED_VERSIONS = ((1, 0, 0), (2, 1, 288))
_KNOWN_TYPES = frozenset(
    "user assistant system summary file-history-snapshot attachment progress queue-operation ai-title "
    "custom-title last-prompt permission-mode mode worktree-state pr-link agent-setting atis-latch".split()
)


def is_subagent_path(path: Path) -> bool:
    return path.name.startswith("agent-") or "subagents" in path.parts


class ClaudeCodeIngester(SessionIngester):
    """Convert a Claude Code session JSONL into ``TraceState``s, one per assistant turn."""

    source = "claude_code"

    def __init__(
        self,
        *,
        system_prompt: str = SYSTEM_PROMPT,
        skip_sidechain: bool = True,
        strip_thinking: bool = True,
        max_history_tokens: int | None = None,
        token_counter: Callable[[str], int] | None = None,
        redact: bool = True,
        redactor: Redactor | None = None,
        example_max_tokens: int = 8192,
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

    # -- parsing -------------------------------------------------------------------------------------------

    def _conversations(
        self, path: Path, records: list[dict[str, Any]], stats: IngestionStats, seen: set[str] | None
    ) -> list[list[list[Event]]]:
        local: set[str] = set()
        kept: list[dict[str, Any]] = []
        last_version: Any = None
        for rec in records:
            if not _well_formed(rec):
                self._bad_record(rec, stats, "envelope field of the wrong type")
                continue
            t = rec.get("type")
            if t not in _KNOWN_TYPES:
                stats.n_unknown_types += 1
            if t == "summary":
                stats.skipped_summary += 1
            elif _is_api_error(rec):
                stats.n_api_errors += 1
            uid = rec.get("uuid")
            if isinstance(uid, str):
                if uid in local or (seen is not None and uid in seen):
                    stats.n_duplicates += 1
                    continue
                local.add(uid)
            v = rec.get("version")
            if v is not None and v != last_version:
                last_version = v
                check_version(v, *TESTED_VERSIONS, "Claude Code", path, stats.version_warnings)
            kept.append(rec)
        if seen is not None:
            seen.update(local)

        chat = [r for r in kept if r.get("type") in ("user", "assistant")]
        whole_file_sidechain = is_subagent_path(path) or (
            chat and all(r.get("isSidechain") is True for r in chat)
        )
        if whole_file_sidechain:
            if self.skip_sidechain:
                stats.skipped_subagent += len(chat)
                stats.n_records_skipped = stats.n_records_total
                return []
            groups = [kept]
        else:
            main = [r for r in kept if r.get("isSidechain") is not True]
            side = [r for r in kept if r.get("isSidechain") is True]
            groups = [self._active_branch(main, stats)]
            if side:
                if self.skip_sidechain:
                    stats.skipped_subagent += sum(1 for r in side if r.get("type") in ("user", "assistant"))
                else:
                    groups.extend(_sidechain_groups(side))
        convs = []
        used = 0
        for g in groups:
            conv, n = self._events(g, stats)
            used += n
            if any(conv):
                convs.append([seg for seg in conv if seg])
        stats.n_records_skipped = stats.n_records_total - used
        return convs

    def _active_branch(self, recs: list[dict[str, Any]], stats: IngestionStats) -> list[dict[str, Any]]:
        """Records on the branch that ends at the last turn, plus parallel-call siblings of that branch."""
        by_uuid = {r["uuid"]: r for r in recs if isinstance(r.get("uuid"), str)}
        leaf = next(
            (r for r in reversed(recs) if r.get("type") in ("user", "assistant") and "uuid" in r), None
        )
        if leaf is None or not by_uuid:
            return recs
        chain: set[str] = set()
        node: dict[str, Any] | None = leaf
        while node is not None and node["uuid"] not in chain:
            chain.add(node["uuid"])
            parent = node.get("parentUuid") or node.get("logicalParentUuid")
            node = by_uuid.get(parent) if isinstance(parent, str) else None
        msg_ids = {_msg_id(r) for r in recs if r.get("uuid") in chain and r.get("type") == "assistant"}
        out, tool_ids = [], set()
        for r in recs:
            uid = r.get("uuid")
            t = r.get("type")
            keep = uid in chain or not isinstance(uid, str)
            if not keep and t == "assistant" and _msg_id(r) in msg_ids:
                keep = True
            if not keep and t == "user":
                ids = _tool_result_ids(r)
                keep = bool(ids) and ids <= tool_ids
            if keep:
                out.append(r)
                if t == "assistant":
                    tool_ids.update(_tool_use_ids(r))
            elif t in ("user", "assistant"):
                stats.n_off_branch += 1
        return out

    def _events(self, recs: list[dict[str, Any]], stats: IngestionStats) -> tuple[list[list[Event]], int]:
        segments: list[list[Event]] = [[]]
        calls: dict[str, Block] = {}
        used = 0
        for r in recs:
            try:
                used += self._record(r, segments, calls, stats)
            except (TypeError, AttributeError, ValueError, KeyError, RecursionError) as exc:
                # A record whose fields have unexpected types: count it, keep the rest of the session.
                self._bad_record(r, stats, f"unusable {r.get('type')} record: {str(exc)[:80]}")
        return segments, used

    def _record(
        self, r: dict[str, Any], segments: list[list[Event]], calls: dict[str, Block], stats: IngestionStats
    ) -> int:
        """Add one record's events; returns 1 if the record was used, else 0."""
        red = self.redactor.redact
        t = r.get("type")
        if t == "system":
            if r.get("subtype") != "compact_boundary":
                return 0
            stats.n_compactions += 1
            if segments[-1]:
                segments.append([])
            return 1
        msg = r.get("message")
        if t not in ("user", "assistant") or not isinstance(msg, dict) or _is_api_error(r):
            return 0
        seg = segments[-1]
        if t == "assistant":
            key = _msg_id(r)
            blocks = self._assistant_blocks(msg.get("content"), stats)
            for b in blocks:
                if b.kind == "tool_use":
                    calls[b.id] = b
            last = next((e for e in reversed(seg) if e.kind != "tool"), None)
            if last is not None and last.kind == "assistant" and last.key == key:
                assert last.blocks is not None
                last.blocks.extend(blocks)
            else:
                seg.append(Event("assistant", blocks=blocks, key=key))
            return 1
        if r.get("isCompactSummary"):
            if seg:
                segments.append([])
            segments[-1].append(Event("user", text=red(text_of(msg.get("content")))))
            return 1
        if r.get("isMeta"):
            stats.n_meta_skipped += 1
            return 0
        content = msg.get("content")
        if isinstance(content, str):
            if content.strip():
                seg.append(Event("user", text=red(content)))
            return 1
        for b in content if isinstance(content, list) else []:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_result":
                seg.append(self._tool_event(b, r, calls, stats))
            else:
                text = text_of([b])
                if text.strip():
                    seg.append(Event("user", text=red(text)))
        return 1

    def _assistant_blocks(self, content: Any, stats: IngestionStats) -> list[Block]:
        red = self.redactor.redact
        if isinstance(content, str):
            stats.n_text_blocks += 1
            return [Block("text", red(content))]
        out = []
        for b in content if isinstance(content, list) else []:
            if not isinstance(b, dict):
                continue
            kind = b.get("type")
            if kind == "text":
                stats.n_text_blocks += 1
                out.append(Block("text", red(str(b.get("text") or ""))))
            elif kind == "tool_use":
                stats.n_tool_use_blocks += 1
                tool_input = self._tool_input(b.get("input", {}))
                out.append(
                    Block(
                        "tool_use",
                        name=str(b.get("name") or "unknown"),
                        input=tool_input,
                        id=str(b.get("id") or ""),
                    )
                )
            elif kind == "thinking":
                stats.n_thinking_blocks += 1
                out.append(Block("thinking", red(str(b.get("thinking") or ""))))
        return out

    def _tool_event(
        self, b: dict[str, Any], rec: dict[str, Any], calls: dict[str, Block], stats: IngestionStats
    ) -> Event:
        stats.n_tool_results += 1
        tid = str(b.get("tool_use_id") or "")
        call = calls.get(tid)
        if call is None:
            stats.n_orphan_tool_results += 1
        name = call.name if call else "unknown"
        tool_input = call.input if call else None
        raw = text_of(b.get("content"))
        structured = rec.get("toolUseResult")
        failed, code = detect_failure(raw, is_error_flag=b.get("is_error") is True, structured=structured)
        text = self.redactor.redact(raw)
        ev = Event("tool", text=text, tool_name=name, tool_use_id=tid, tool_input=tool_input)
        if failed:
            stats.n_tool_errors += 1
            kind = classify_error(raw, exit_code=code, denial=rec.get("toolDenialKind"))
            ev.error_kind = kind
            ev.error_meta = tool_error_meta(kind, name, text, tool_input, code)
            ev.error = ev.error_meta["error_message"] or "(empty error output)"
        return ev


_STR_OR_NONE = ("uuid", "parentUuid", "logicalParentUuid", "type", "subtype")


def _well_formed(r: dict[str, Any]) -> bool:
    """The envelope fields the parser relies on have usable types (anything else passes through)."""
    for k in _STR_OR_NONE:
        v = r.get(k)
        if v is not None and type(v) is not str:
            return False
    m = r.get("message")
    if m is None:
        return True
    if type(m) is not dict:
        return False
    mid = m.get("id")
    return mid is None or type(mid) is str


def _is_api_error(r: dict[str, Any]) -> bool:
    if r.get("type") == "system":
        return r.get("subtype") == "api_error"
    if r.get("type") != "assistant":
        return False
    m = r.get("message")
    return bool(r.get("isApiErrorMessage")) or (isinstance(m, dict) and m.get("model") == "<synthetic>")


def _msg_id(r: dict[str, Any]) -> str:
    m = r.get("message")
    mid = m.get("id") if isinstance(m, dict) else None
    return mid if isinstance(mid, str) else str(r.get("uuid", id(r)))


def _tool_use_ids(r: dict[str, Any]) -> set[str]:
    c = r.get("message", {}).get("content") if isinstance(r.get("message"), dict) else None
    return (
        {b.get("id") for b in c if isinstance(b, dict) and b.get("type") == "tool_use"}
        if isinstance(c, list)
        else set()
    )


def _tool_result_ids(r: dict[str, Any]) -> set[str]:
    c = r.get("message", {}).get("content") if isinstance(r.get("message"), dict) else None
    if not isinstance(c, list):
        return set()
    return {
        b["tool_use_id"]
        for b in c
        if isinstance(b, dict) and b.get("type") == "tool_result" and isinstance(b.get("tool_use_id"), str)
    }


def _sidechain_groups(side: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split inline sidechain records into one group per subagent run (by root of the parent chain)."""
    parent = {r["uuid"]: r.get("parentUuid") for r in side if isinstance(r.get("uuid"), str)}
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in side:
        node = r.get("uuid")
        seen = set()
        while isinstance(node, str) and parent.get(node) in parent and node not in seen:
            seen.add(node)
            node = parent[node]
        groups.setdefault(str(node), []).append(r)
    return list(groups.values())
