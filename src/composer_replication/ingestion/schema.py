"""The stored ingestion item (one line of ``parts/<part>.jsonl``): its typed definition and its legend.

Parsing turns every session record into one compact *item* (phase 1); assembly reads only items (phase 2).
Items are stored once per session file, so their keys are short (1-3 letters: the parts are the bulk of an
ingest folder, and the keys are most of a small item's bytes). This module is the reference for those
keys: the ``TypedDict`` definitions say which key holds what type, :data:`LEGEND` gives each key its
readable name and meaning (docs/ingestion.md prints it), and :func:`readable` renames an item's keys for
reading or tooling (``readable(item, "claude_code")``). ``tests/ingestion/test_schema.py`` checks that every
key written for the bundled sessions is in the legend, so the legend cannot fall behind the parsers.

A change of the item format bumps ``_index.INDEX_VERSION``, so the next ingest re-parses every file instead
of reading items of the old format.
"""

from __future__ import annotations

from typing import Any, TypedDict

# -- Claude Code -------------------------------------------------------------------------------------------


class ClaudeBlock(TypedDict, total=False):
    """An assistant content block (``ClaudeItem["b"]``)."""

    k: str  # kind: "text", "tool_use", "thinking"
    t: str  # text (text, thinking), redacted
    n: str  # tool name (tool_use)
    i: Any  # tool input, redacted (tool_use)
    id: str  # tool call id (tool_use)


class ClaudeEvent(TypedDict, total=False):
    """A user-side event (``ClaudeItem["e"]``): user text, a tool result or harness context."""

    k: str  # kind: "u" user text, "r" tool result, "c" context the model sees
    t: str  # text, redacted
    id: str  # the tool call it answers (r)
    ag: str  # the subagent's id, when the result is a subagent run's (r)
    can: int  # 1: cancelled because a parallel sibling call failed, not a failure of its own (r)
    f: int  # 1: the call failed (r)
    ek: str  # error kind (r, failed): errors.classify_error
    c: Any  # exit code (r, failed, when known); context kind (c: "meta", "skill", "caveat", "attachment:<type>")


class ClaudeProgress(TypedDict):
    """A subagent's message carried by an ``agent_progress`` record (``ClaudeItem["ap"]``)."""

    a: str  # agent id
    ptu: str | None  # the parent's tool call id
    it: ClaudeItem  # the message, as an item


class ClaudeMeta(TypedDict, total=False):
    """Session fields that changed at this record (``ClaudeItem["meta"]``)."""

    sid: str  # session id
    cwd: str  # working directory, redacted
    branch: str  # git branch, redacted


class ClaudeItem(TypedDict, total=False):
    """One Claude Code record."""

    t: (
        str | None
    )  # the record's type: "user", "assistant", "system", "summary", "attachment", "progress", ...
    u: str  # uuid
    p: str  # parent uuid
    lp: str  # logical parent uuid (across a compaction)
    sc: int  # 1: a sidechain (subagent) record
    ag: str  # the sidechain's agent id
    meta: ClaudeMeta
    ts: str  # timestamp (user, assistant)
    x: int  # 1: a synthetic API-error record (dropped at assembly)
    m: str  # message id (assistant; the records of one API response share it)
    b: list[ClaudeBlock]  # content blocks (assistant)
    us: list[int]  # usage: input, output, cache-creation input, cache-read input tokens (assistant)
    rq: str  # request id (assistant)
    e: list[ClaudeEvent]  # events (user, context attachments)
    s: str  # compaction summary text (the user record that opens a compacted segment), redacted
    cb: int  # 1: a compaction boundary (a new segment starts)
    ti: list[Any]  # title: ["summary", text, leaf uuid] or ["ai", text] or ["custom", text]
    ad: str  # an attachment type left out (not shown to the model); counted
    ap: ClaudeProgress  # a subagent's message (agent_progress)


# -- Codex ---------------------------------------------------------------------------------------------------


class CodexItem(TypedDict, total=False):
    """One Codex rollout line."""

    t: str  # kind: "meta", "u" user, "c" context, "at" assistant text, "ah" reasoning summary,
    #         "au" tool call, "r" tool result, "cmp" compaction, "tok" token count
    tx: str  # text, redacted (u, c, at, ah, r, cmp)
    ts: str  # timestamp (u, meta)
    c: Any  # context kind (c: "developer", "environment", "instructions", ...); exit code (r, failed)
    n: str  # tool name (au)
    i: Any  # tool input, redacted (au)
    id: str  # tool call id (au, r)
    f: int  # 1: the call failed (r)
    ek: str  # error kind (r, failed)
    v: dict[str, int]  # total token usage (tok)
    session_id: str  # (meta)
    cwd: str  # working directory, redacted (meta)
    version: str  # CLI version (meta)
    sub: Any  # subagent origin (meta): the session is a subagent's


# -- the legend: key -> (readable name, meaning), per place ----------------------------------------------------

LEGEND: dict[str, dict[str, tuple[str, str]]] = {
    "claude_code": {
        "t": ("type", "the record's type (user, assistant, system, summary, attachment, progress, ...)"),
        "u": ("uuid", "the record's uuid"),
        "p": ("parent_uuid", "its parent in the parentUuid tree"),
        "lp": ("logical_parent_uuid", "its logical parent across a compaction"),
        "sc": ("sidechain", "1: a subagent (sidechain) record"),
        "ag": ("agent_id", "the sidechain's agent id"),
        "meta": ("session_fields", "session id, working directory, git branch where they change"),
        "ts": ("timestamp", "the record's timestamp"),
        "x": ("api_error", "1: a synthetic API-error record, dropped at assembly"),
        "m": ("message_id", "the API response it belongs to (its records share it)"),
        "b": ("blocks", "assistant content blocks"),
        "us": ("usage", "input, output, cache-creation and cache-read input tokens"),
        "rq": ("request_id", "the API request id"),
        "e": ("events", "user text, tool results and context the model sees"),
        "s": ("compaction_summary", "the summary that opens a compacted segment"),
        "cb": ("compaction_boundary", "1: a new segment starts here"),
        "ti": ("title", '["summary", text, leaf uuid], ["ai", text] or ["custom", text]'),
        "ad": ("attachment_left_out", "the type of an attachment the model does not see"),
        "ap": ("agent_progress", "a subagent's message carried by a progress record"),
    },
    "claude_code.b": {
        "k": ("kind", "text, tool_use or thinking"),
        "t": ("text", "the text or thinking"),
        "n": ("tool_name", "the tool called"),
        "i": ("tool_input", "the call's input"),
        "id": ("tool_call_id", "the call's id"),
    },
    "claude_code.e": {
        "k": ("kind", "u: user text, r: tool result, c: context"),
        "t": ("text", "the text"),
        "id": ("tool_call_id", "the call a result answers"),
        "ag": ("agent_id", "the subagent whose run the result is"),
        "can": ("cancelled", "1: cancelled because a parallel call failed"),
        "f": ("failed", "1: the call failed"),
        "ek": ("error_kind", "the failure's kind (errors.classify_error)"),
        "c": ("code_or_context_kind", "a failed result's exit code; a context event's kind"),
    },
    "claude_code.ap": {
        "a": ("agent_id", "the subagent"),
        "ptu": ("parent_tool_call_id", "the parent's tool call that started it"),
        "it": ("item", "its message, as an item"),
    },
    "claude_code.meta": {
        "sid": ("session_id", "the session id"),
        "cwd": ("cwd", "the working directory"),
        "branch": ("git_branch", "the git branch"),
    },
    "codex": {
        "t": ("kind", "meta, u, c, at (assistant text), ah (reasoning), au (tool call), r, cmp, tok"),
        "tx": ("text", "the text"),
        "ts": ("timestamp", "the line's timestamp"),
        "c": ("code_or_context_kind", "a context item's kind; a failed result's exit code"),
        "n": ("tool_name", "the tool called"),
        "i": ("tool_input", "the call's input"),
        "id": ("tool_call_id", "the call's id (au) or the call a result answers (r)"),
        "f": ("failed", "1: the call failed"),
        "ek": ("error_kind", "the failure's kind"),
        "v": ("token_usage", "the session's total token usage so far"),
        "session_id": ("session_id", "the session id"),
        "cwd": ("cwd", "the working directory"),
        "version": ("cli_version", "the Codex CLI version"),
        "sub": ("subagent", "the session is a subagent's: where it came from"),
    },
}

_NESTED = {"b": list, "e": list, "ap": dict, "meta": dict}


def readable(item: dict[str, Any], source: str) -> dict[str, Any]:
    """``item`` with readable key names (``{"t": "user", "u": ...}`` -> ``{"type": "user", "uuid": ...}``),
    nested blocks, events and subagent messages too. Keys not in the legend are kept as they are."""
    return _rename(item, source)


def _rename(obj: dict[str, Any], scope: str) -> dict[str, Any]:
    names = LEGEND.get(scope, {})
    root = scope.split(".")[0]
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if scope == root and k in _NESTED and root == "claude_code":
            sub = f"{root}.{k}"
            if isinstance(v, list):
                v = [_rename(x, sub) if isinstance(x, dict) else x for x in v]
            elif isinstance(v, dict):
                v = _rename(v, sub)
        elif scope == "claude_code.ap" and k == "it" and isinstance(v, dict):
            v = _rename(v, root)
        out[names[k][0] if k in names else k] = v
    return out
