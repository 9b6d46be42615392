"""Claude Code session JSONL -> items (parse) -> conversations (assemble); see ``_claude_assemble`` for phase 2.

The format is unspecified and changes between CLI versions (notes: interfaces.md §1). Parsing turns each
record into one compact item, locally (docs/ingestion.md has the table of record types):

* ``user`` / ``assistant`` records keep their envelope (uuid, parents, sidechain flag, message id) and their
  content: text, tool calls (inputs redacted), thinking, tool results (classified: failed? which kind?);
* ``isMeta`` user records (slash-command expansions, Skill bodies, local-command caveats) and ``attachment``
  records the model sees (hook context, skill listings, task reminders, ...) become *context*;
* ``compact_boundary`` marks a new segment, ``isCompactSummary`` opens it; synthetic API errors are marked;
* ``summary`` / ``ai-title`` / ``custom-title`` give the session title; ``message.usage`` the token totals;
* ``agent_progress`` records carry a subagent's messages (used when sidechains are included and the
  subagent has no transcript file of its own);
* display-only and bookkeeping records (hook/bash progress, turn durations, snapshots, ...) stay only as
  nodes of the ``parentUuid`` tree (if they have a uuid) and are counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from composer_replication.ingestion import _claude_assemble
from composer_replication.ingestion._base import AssemblyInputs, SessionIngester, mark_failure
from composer_replication.ingestion._claude_assemble import is_subagent_path
from composer_replication.ingestion._reader import check_version, text_of
from composer_replication.ingestion._session import Conversation, IngestionStats
from composer_replication.wire import SYSTEM_PROMPT

__all__ = ["SYSTEM_PROMPT", "ClaudeCodeIngester", "IngestionStats", "is_subagent_path"]

TESTED_VERSIONS = ((1, 0, 0), (2, 1, 288))
_KNOWN_TYPES = frozenset(
    "user assistant system summary file-history-snapshot attachment progress queue-operation ai-title "
    "custom-title last-prompt permission-mode mode worktree-state pr-link agent-setting atis-latch".split()
)
# Attachment types whose text is injected into the model's context (as a system reminder). The other
# ``hook_*`` attachments record a hook run for the transcript view; their model-facing part, if any, is a
# separate ``hook_additional_context`` attachment. Types not listed are left out and counted by type.
CONTEXT_ATTACHMENTS = frozenset(
    "hook_additional_context skill_listing task_reminder todo_reminder deferred_tools_delta plan_mode "
    "plan_mode_exit nested_memory critical_system_reminder queued_command date_change edited_text_file "
    "opened_file_in_ide selected_lines_in_ide diagnostics invoked_skills compact_file_reference "
    "hook_blocking_error output_style".split()
)


class ClaudeCodeIngester(SessionIngester):
    """Convert a Claude Code session JSONL into ``TraceState``s, one per assistant turn."""

    source = "claude_code"

    # -- phase 1: one record -> one item ----------------------------------------------------------------

    def parse_record(
        self, r: dict[str, Any], stats: IngestionStats, ctx: dict[str, Any], nested: bool = False
    ) -> dict[str, Any] | None:
        get = r.get
        t, uid, par, lpar, sub = (
            get("type"),
            get("uuid"),
            get("parentUuid"),
            get("logicalParentUuid"),
            get("subtype"),
        )
        msg = get("message")
        _check_envelope(t, uid, par, lpar, sub, msg)
        sc = get("isSidechain") is True
        if not nested:
            if t not in _KNOWN_TYPES:
                stats.n_unknown_types += 1
            v = get("version")
            if v is not None and v != ctx.get("ver"):
                ctx["ver"] = v
                assert stats.version_warnings is not None  # IngestionStats.__post_init__
                check_version(
                    v, *TESTED_VERSIONS, "Claude Code", ctx.get("file", "session"), stats.version_warnings
                )
            if sc and self.skip_sidechain:  # never used: keep its place, not its text
                return _node(t, uid, par, lpar, True) if uid is not None else {"t": t, "sc": 1}
            if t == "progress" and (self.skip_sidechain or not _agent_progress(r)):
                stats.n_display_only += 1  # the most common record: only its place in the tree matters
                return _node(t, uid, par, lpar, sc) if uid is not None else None
        it = _node(t, uid, par, lpar, sc)
        if sc and isinstance(get("agentId"), str):
            it["ag"] = r["agentId"]
        if not nested and (
            r.get("sessionId") != ctx.get("sid")
            or r.get("cwd") != ctx.get("cwd")
            or r.get("gitBranch") != ctx.get("branch")
        ):
            self._session_meta(r, ctx, it)
        if t == "assistant" or t == "user":
            if isinstance(get("timestamp"), str):
                it["ts"] = r["timestamp"]
            if msg is None:
                return it
            if t == "assistant":
                if _is_api_error(r):
                    if not nested:
                        stats.n_api_errors += 1
                    it["x"] = 1
                    return it
                self._assistant(r, msg, it)
            else:
                self._user(r, msg, it)
            return it
        return self._other_record(t, sub, r, it, stats, ctx, nested)

    def _session_meta(self, r: dict[str, Any], ctx: dict[str, Any], it: dict[str, Any]) -> None:
        """The session id, working directory or branch a record changes, on its item (``meta``) and in
        ``ctx``. The context keeps the values as the items hold them (redacted): it is saved in the ingest
        index."""
        meta = {}
        for k, f in _META_FIELDS:
            v = r.get(f)
            if isinstance(v, str) and v != ctx.get(k):
                v = v if k == "sid" else self.redactor.redact(v)
                if v != ctx.get(k):
                    meta[k] = v
        if meta:
            ctx.update(meta)
            it["meta"] = meta

    def _other_record(
        self,
        t: Any,
        sub: Any,
        r: dict[str, Any],
        it: dict[str, Any],
        stats: IngestionStats,
        ctx: dict[str, Any],
        nested: bool,
    ) -> dict[str, Any] | None:
        """The item of a record that is not a message, by type: a compaction boundary or API error
        (``system``), the session's title (``summary``, ``ai-title``, ``custom-title``), context the
        model saw (``attachment``), a subagent's message (``progress``); the rest is display-only."""
        if t == "system":
            if sub == "compact_boundary":
                it["cb"] = 1
            elif sub == "api_error":
                stats.n_api_errors += 1
                it["x"] = 1
            else:
                stats.n_display_only += 1
        elif t == "summary":
            stats.skipped_summary += 1
            if isinstance(r.get("summary"), str):
                it["ti"] = ["summary", self.redactor.redact(r["summary"]), r.get("leafUuid")]
        elif t in ("ai-title", "custom-title"):
            key = "aiTitle" if t == "ai-title" else "customTitle"
            if isinstance(r.get(key), str):
                it["ti"] = [t[:-6], self.redactor.redact(r[key])]
        elif t == "attachment":
            a = r.get("attachment")
            kind = a.get("type") if isinstance(a, dict) else None
            if isinstance(a, dict) and kind in CONTEXT_ATTACHMENTS:
                text = _attachment_text(a)
                if text.strip():
                    it["e"] = [{"k": "c", "c": f"attachment:{kind}", "t": self.redactor.redact(text)}]
            else:
                it["ad"] = str(kind)  # left out; counted by type at assembly
        elif t == "progress" and not nested:
            d = r.get("data")
            if isinstance(d, dict) and d.get("type") == "agent_progress" and not self.skip_sidechain:
                inner = d.get("message")
                if isinstance(inner, dict) and inner.get("type") in ("user", "assistant"):
                    child = self.parse_record(inner, stats, ctx, nested=True)
                    if child is not None:
                        it["ap"] = {
                            "a": str(d.get("agentId") or ""),
                            "ptu": r.get("parentToolUseID"),
                            "it": child,
                        }
                        return it
            stats.n_display_only += 1
        else:
            stats.n_display_only += 1
        if len(it) == 1:  # a record without a uuid that carries nothing: not even a tree node
            return None
        return it

    def node_only(self, rec: dict[str, Any]) -> dict[str, Any] | None:
        if not _well_formed(rec) or not isinstance(rec.get("uuid"), str):
            return None
        it: dict[str, Any] = {"t": rec.get("type"), "u": rec["uuid"]}
        for src, dst in (("parentUuid", "p"), ("logicalParentUuid", "lp")):
            if rec.get(src) is not None:
                it[dst] = rec[src]
        if rec.get("isSidechain") is True:
            it["sc"] = 1
        return it

    def _assistant(self, r: dict[str, Any], msg: dict[str, Any], it: dict[str, Any]) -> None:
        red = self.redactor.redact
        mid = msg.get("id")
        it["m"] = mid if isinstance(mid, str) else str(r.get("uuid", ""))
        content = msg.get("content")
        blocks: list[dict[str, Any]] = []
        if isinstance(content, str):
            blocks.append({"k": "text", "t": red(content)})
        for b in content if isinstance(content, list) else []:
            if not isinstance(b, dict):
                continue
            kind = b.get("type")
            if kind == "text":
                blocks.append({"k": "text", "t": red(str(b.get("text") or ""))})
            elif kind == "tool_use":
                blocks.append(
                    {
                        "k": "tool_use",
                        "n": str(b.get("name") or "unknown"),
                        "i": self._tool_input(b.get("input", {})),
                        "id": str(b.get("id") or ""),
                    }
                )
            elif kind == "thinking":
                blocks.append({"k": "thinking", "t": red(str(b.get("thinking") or ""))})
        it["b"] = blocks
        usage = msg.get("usage")
        if isinstance(usage, dict):
            it["us"] = [v if type(v) is int else 0 for v in map(usage.get, _USAGE_KEYS)]  # bool is no count
            if isinstance(r.get("requestId"), str):
                it["rq"] = r["requestId"]

    def _user(self, r: dict[str, Any], msg: dict[str, Any], it: dict[str, Any]) -> None:
        red = self.redactor.redact
        content = msg.get("content")
        if r.get("isCompactSummary"):
            it["s"] = red(text_of(content))
            return
        if r.get("isMeta"):
            text = text_of(content)
            if text.strip():
                it["e"] = [{"k": "c", "c": _meta_kind(text), "t": red(text)}]
            return
        events: list[dict[str, Any]] = []
        if isinstance(content, str):
            if content.strip():
                events.append({"k": "u", "t": red(content)})
        for b in content if isinstance(content, list) else []:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_result":
                events.append(self._tool_result(b, r))
            else:
                text = text_of([b])
                if text.strip():
                    events.append({"k": "u", "t": red(text)})
        it["e"] = events

    def _tool_result(self, b: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
        raw = text_of(b.get("content"))
        structured = rec.get("toolUseResult")
        ev: dict[str, Any] = {"k": "r", "id": str(b.get("tool_use_id") or ""), "t": self.redactor.redact(raw)}
        if isinstance(structured, dict) and isinstance(structured.get("agentId"), str):
            ev["ag"] = structured["agentId"]
        if is_cancellation(raw):
            ev["can"] = 1  # a parallel call cancelled because a sibling failed: it did not fail itself
            return ev
        flagged = b.get("is_error") is True
        return mark_failure(
            ev, raw, is_error_flag=flagged, structured=structured, denial=rec.get("toolDenialKind")
        )

    # -- phase 2 -------------------------------------------------------------------------------------------

    def assemble(
        self, path: Path, items: list[dict[str, Any]], stats: IngestionStats, inputs: AssemblyInputs
    ) -> list[Conversation]:
        return _claude_assemble.conversations(self, path, items, stats, inputs)


def _node(t: Any, uid: str | None, par: Any, lpar: Any, sc: bool) -> dict[str, Any]:
    """A record's place in the ``parentUuid`` tree (what ``node_only`` gives a well-formed one): type,
    uuid, parent, logical parent, sidechain flag; every record's item starts from it."""
    it: dict[str, Any] = {"t": t}
    if uid is not None:
        it["u"] = uid
    if par is not None:
        it["p"] = par
    if lpar is not None:
        it["lp"] = lpar
    if sc:
        it["sc"] = 1
    return it


_META_FIELDS = (("sid", "sessionId"), ("cwd", "cwd"), ("branch", "gitBranch"))
_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _agent_progress(r: dict[str, Any]) -> bool:
    d = r.get("data")
    return isinstance(d, dict) and d.get("type") == "agent_progress"


def is_cancellation(text: str) -> bool:
    head = text[:300]
    return "Sibling tool call errored" in head or "Cancelled: parallel tool call" in head


def _meta_kind(text: str) -> str:
    head = text[:300]
    if head.startswith("Base directory for this skill"):
        return "skill"
    if "<local-command-caveat>" in head or head.startswith("Caveat: The messages below"):
        return "caveat"
    return "meta"


def _attachment_text(a: dict[str, Any]) -> str:
    import json

    c = a.get("content")
    if c is None:
        if isinstance(a.get("addedNames"), list):
            return "Tools available: " + ", ".join(str(x) for x in a["addedNames"])
        c = {k: v for k, v in a.items() if k not in ("type", "toolUseID", "hookEvent", "hookName")}
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(
            x if isinstance(x, str) else json.dumps(x, ensure_ascii=False, default=str) for x in c
        )
    return json.dumps(c, ensure_ascii=False, default=str)


_STR_OR_NONE = ("uuid", "parentUuid", "logicalParentUuid", "type", "subtype")


def _check_envelope(t: Any, uid: Any, par: Any, lpar: Any, sub: Any, msg: Any) -> None:
    """The envelope fields the parser relies on have usable types (what _well_formed checks, unrolled)."""
    if not (
        (t is None or type(t) is str)
        and (uid is None or type(uid) is str)
        and (par is None or type(par) is str)
        and (lpar is None or type(lpar) is str)
        and (sub is None or type(sub) is str)
    ):
        raise ValueError("envelope field of the wrong type")
    if msg is not None and (
        type(msg) is not dict or ((mid := msg.get("id")) is not None and type(mid) is not str)
    ):
        raise ValueError("envelope field of the wrong type")


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
    m = r.get("message")
    return bool(r.get("isApiErrorMessage")) or (isinstance(m, dict) and m.get("model") == "<synthetic>")
