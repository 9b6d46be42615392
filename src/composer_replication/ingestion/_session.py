"""The normalised session both parsers produce: stats, events, conversations.

A parser (Claude Code, Codex) emits *conversations*; a conversation is a list of *segments* (split at
compaction boundaries); a segment is a list of :class:`Event` (user text, harness context, one merged assistant
turn, one tool result). ``_build`` turns conversations into traces, state references and example references, so
both formats give identical shapes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from composer_replication import wire
from composer_replication.ingestion.errors import clean_error_message


@dataclass
class IngestionStats:
    """Counters filled while a session streams; ``ingester.last_stats`` after ``ingest()``.

    Invariant (tested): ``n_lines == n_records_total + skipped_truncated_lines`` — every non-empty line is a
    parsed record or a counted bad line (truncated, non-JSON, not an object, or undecodable).
    """

    n_records_total: int = 0
    n_records_skipped: int = 0
    n_states_emitted: int = 0
    n_assistant_turns: int = 0
    n_tool_use_blocks: int = 0
    n_text_blocks: int = 0
    skipped_subagent: int = 0
    skipped_summary: int = 0
    skipped_truncated_lines: int = 0
    version_warnings: list[str] | None = None
    # Added counters (not in the original reference).
    n_files: int = 0
    n_lines: int = 0
    n_non_utf8_lines: int = 0
    n_unknown_types: int = 0
    n_malformed_records: int = 0
    n_duplicates: int = 0
    n_api_errors: int = 0
    n_off_branch: int = 0
    n_meta_skipped: int = 0
    n_compactions: int = 0
    n_tool_results: int = 0
    n_tool_errors: int = 0
    n_orphan_tool_results: int = 0
    n_thinking_blocks: int = 0
    n_empty_turns: int = 0
    n_history_truncated: int = 0
    n_examples: int = 0
    n_file_errors: int = 0
    n_context: int = 0  # harness context kept (isMeta expansions, Skill bodies, attachments, instructions)
    n_display_only: int = 0  # display-only records left out (hook progress, turn durations, ...)
    n_cancelled_tool_calls: int = 0  # parallel calls cancelled because a sibling failed (not errors)
    n_subagent_runs: int = 0  # sidechain conversations kept (with include_sidechains)
    n_traces: int = 0
    n_traces_trivial: int = 0  # warmup / empty sessions left out
    n_sessions_filtered: int = 0  # session files left out by --since/--until/--project/--session
    n_records_used: int = 0  # records that contributed to a conversation (n_records_skipped = total - used)
    error_kinds: dict[str, int] = field(default_factory=dict)
    attachments_left_out: dict[str, int] = field(
        default_factory=dict
    )  # attachment types not shown to the model
    redactions: dict[str, int] = field(default_factory=dict)
    # logged tool inputs that disagree with their tool's schema (``tool_schemas.input_problems``), by reason
    n_schema_mismatches: int = 0
    schema_mismatches: dict[str, int] = field(default_factory=dict)
    # Per file only (not totalled): the first problem lines ({"line", "reason"}) and why the file failed.
    bad_lines: list[dict[str, Any]] = field(default_factory=list)
    file_error: str | None = None

    def __post_init__(self) -> None:
        if self.version_warnings is None:
            self.version_warnings = []

    def add(self, other: IngestionStats | dict[str, Any]) -> None:
        """Accumulate ``other`` (stats, or saved counters from :meth:`sparse`) into ``self``."""
        items = other.items() if isinstance(other, dict) else ((k, getattr(other, k)) for k in _FIELD_NAMES)
        for k, v in items:
            if k in _PER_FILE or not v:
                continue
            mine = getattr(self, k)
            if isinstance(v, int):
                setattr(self, k, mine + v)
            elif isinstance(v, dict):
                for kk, vv in v.items():
                    mine[kk] = mine.get(kk, 0) + vv
            elif isinstance(v, list):
                mine.extend(x for x in v if x not in mine)

    def sparse(self) -> dict[str, Any]:
        """The counters that are not zero/empty (what the index saves per file)."""
        return {k: v for k, v in self.to_dict().items() if v}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IngestionStats:
        """A copy of saved counters (dicts and lists copied: ``add`` must never change the saved ones)."""
        copied: dict[str, Any] = {
            k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
            for k, v in d.items()
        }
        return cls(**copied)

    def finish(self) -> IngestionStats:
        """Derive ``n_records_skipped`` once the file's line and assembly counters are both in."""
        self.n_records_skipped = max(0, self.n_records_total - self.n_records_used)
        return self

    def to_dict(self) -> dict[str, Any]:
        """A copy as plain data (dicts and lists copied)."""
        return {
            k: dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
            for k in _FIELD_NAMES
            for v in (getattr(self, k),)
        }


_PER_FILE = frozenset({"bad_lines", "file_error"})
_FIELD_NAMES = tuple(f.name for f in fields(IngestionStats))


@dataclass(slots=True)
class Block:
    kind: str  # "text" | "tool_use" | "thinking"
    text: str = ""
    name: str = ""
    input: Any = None
    id: str = ""


@dataclass(slots=True)
class Event:
    kind: str  # "user" | "context" | "assistant" | "tool"
    text: str = ""
    blocks: list[Block] | None = None
    key: str = ""  # assistant: the API message id used for merging
    tool_name: str = ""
    tool_use_id: str = ""
    tool_input: Any = None
    error: str | None = None
    error_kind: str | None = None
    error_meta: dict[str, Any] | None = None
    context_kind: str = ""  # context: where it came from ("meta", "attachment:<type>", "developer", ...)
    agent_id: str = ""  # tool: the subagent a Task/Agent call started (toolUseResult.agentId)
    ts: str = ""  # user and tool events: the record's timestamp where the format gives one (ISO-8601)


@dataclass
class Conversation:
    """One conversation of a session file: the main one (``suffix == ""``) or a subagent run (``"@<id>"``)."""

    segments: list[list[Event]]
    suffix: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # parent link of a subagent run, title, usage, ...


def render_action(blocks: list[Block], *, thinking: bool) -> str:
    """The student-action text (``wire``): blocks in order, separated by a blank line."""
    parts = []
    for b in blocks:
        if b.kind == "text":
            if b.text.strip():
                parts.append(b.text)
        elif b.kind == "tool_use":
            if not b.text:  # the rendered call, cached on the block (each turn is rendered twice)
                b.text = wire.format_tool_use(b.name, b.input)
            parts.append(b.text)
        elif b.kind == "thinking" and thinking and b.text.strip():
            parts.append(wire.format_thinking(b.text))
    return wire.ACTION_SEP.join(parts)


def estimate_tokens(text: str) -> int:
    """Tokenizer-free estimate: ~4 characters per token (BPE on English and code) + 4 for the template."""
    return len(text) // 4 + 4


@dataclass
class BuildOptions:
    system_prompt: str
    strip_thinking: bool = True
    max_history_tokens: int | None = None
    token_counter: Callable[[str], int] = estimate_tokens
    example_max_tokens: int = 8192
    source: str = "claude_code"


def mark_repeats(segment: list[Event]) -> None:
    """Re-label an error as ``repeated_failure`` when the same call (tool + input) failed just before."""
    last: tuple[str, str] | None = None
    count = 0
    for ev in segment:
        if ev.kind != "tool":
            continue
        if ev.error is None:
            last, count = None, 0
            continue
        sig = (ev.tool_name, json.dumps(ev.tool_input, sort_keys=True, default=str))
        if sig == last:
            count += 1
            assert ev.error_meta is not None
            ev.error_meta["original_kind"] = ev.error_kind
            ev.error_meta["n_repeats"] = count
            ev.error_kind = "repeated_failure"
            ev.error_meta["error_kind"] = "repeated_failure"
        else:
            last, count = sig, 1


def tool_error_meta(
    kind: str, tool_name: str, message: str, tool_input: Any, exit_code: int | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "error_kind": kind,
        "tool_name": tool_name,
        "error_message": clean_error_message(message),
        "tool_input": tool_input,
    }
    if exit_code is not None:
        meta["exit_code"] = exit_code
    return meta


def _count_kinds(stats: IngestionStats, seg: list[Event]) -> None:
    for ev in seg:
        if ev.kind == "tool" and ev.error_kind:
            stats.error_kinds[ev.error_kind] = stats.error_kinds.get(ev.error_kind, 0) + 1
