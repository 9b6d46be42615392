"""The normalised session both parsers produce, and the code that turns it into states and examples.

A parser (Claude Code, Codex) emits *conversations*; a conversation is a list of *segments* (split at
compaction boundaries); a segment is a list of :class:`Event` (user text, one merged assistant turn, one tool
result). Everything downstream — ``TraceState`` rows, ``TraceExample`` rows, error sites, history windows —
is built here, so both formats give identical shapes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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
    error_kinds: dict[str, int] = field(default_factory=dict)
    redactions: dict[str, int] = field(default_factory=dict)
    # Per file only (not totalled): the first problem lines ({"line", "reason"}) and why the file failed.
    bad_lines: list[dict[str, Any]] = field(default_factory=list)
    file_error: str | None = None

    def __post_init__(self) -> None:
        if self.version_warnings is None:
            self.version_warnings = []

    def add(self, other: IngestionStats) -> None:
        """Accumulate ``other`` into ``self`` (used to total several files)."""
        for k, v in asdict(other).items():
            if k in _PER_FILE:
                continue
            mine = getattr(self, k)
            if isinstance(v, int):
                setattr(self, k, mine + v)
            elif isinstance(v, dict):
                for kk, vv in v.items():
                    mine[kk] = mine.get(kk, 0) + vv
            elif isinstance(v, list):
                mine.extend(x for x in v if x not in mine)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_PER_FILE = frozenset({"bad_lines", "file_error"})


@dataclass(slots=True)
class Block:
    kind: str  # "text" | "tool_use" | "thinking"
    text: str = ""
    name: str = ""
    input: Any = None
    id: str = ""


@dataclass(slots=True)
class Event:
    kind: str  # "user" | "assistant" | "tool"
    text: str = ""
    blocks: list[Block] | None = None
    key: str = ""  # assistant: the API message id used for merging
    tool_name: str = ""
    tool_use_id: str = ""
    tool_input: Any = None
    error: str | None = None
    error_kind: str | None = None
    error_meta: dict[str, Any] | None = None


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


def build(
    conversations: list[list[list[Event]]], stem: str, opts: BuildOptions, stats: IngestionStats
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Turn parsed conversations into ``(states, examples)`` for one session file."""
    states: list[dict[str, Any]] = []
    examples: list[dict[str, Any]] = []
    idx = 0
    for conv in conversations:
        # The tools this conversation calls (a sidechain kept as its own conversation has its own).
        tools = sorted({b.name for seg in conv for ev in seg if ev.blocks for b in ev.blocks if b.name})
        system = {"role": "system", "content": wire.system_text(tools, base=opts.system_prompt)}
        sys_tokens = opts.token_counter(system["content"])
        for seg_no, seg in enumerate(conv):
            mark_repeats(seg)
            _count_kinds(stats, seg)
            # ``msgs`` is always ``wire.turns_to_messages(turns)``: built turn by turn with wire.append_turn.
            msgs: list[dict[str, str]] = []
            cum = [0]  # prefix sums of token estimates over msgs
            start = 0
            last_error: dict[str, Any] | None = None
            turns: list[dict[str, Any]] = []
            for ev in seg:
                if ev.kind == "assistant":
                    stats.n_assistant_turns += 1
                    action = render_action(ev.blocks or [], thinking=True)
                    hist = render_action(ev.blocks or [], thinking=not opts.strip_thinking)
                    sid = f"{stem}::{idx:04d}"
                    if action:
                        idx += 1
                        if opts.max_history_tokens is not None and msgs:
                            budget = opts.max_history_tokens - sys_tokens
                            while start < len(msgs) - 1 and cum[-1] - cum[start] > budget:
                                start += 1
                            stats.n_history_truncated += int(start > 0)
                        row: dict[str, Any] = {
                            "state_id": sid,
                            "messages": [system, *msgs[start:]],
                            "student_action": action,
                            "trace_id": stem,
                            "turn_index": stats.n_states_emitted,
                            "source": opts.source,
                            "tools": tools,
                        }
                        if last_error is not None:
                            row["error_kind"] = last_error["error_kind"]
                        states.append(row)
                        stats.n_states_emitted += 1
                    else:
                        stats.n_empty_turns += 1
                    last_error = None
                    calls = [
                        {"name": b.name, "arguments": b.input}
                        for b in ev.blocks or []
                        if b.kind == "tool_use"
                    ]
                    _add(
                        msgs,
                        cum,
                        turns,
                        {
                            "role": "assistant",
                            "content": hist,
                            "tool_call": calls[0] if calls else None,
                            "tool_calls": calls,
                            "state_id": sid if action else None,
                        },
                        opts,
                    )
                elif ev.kind == "tool":
                    turn: dict[str, Any] = {
                        "role": "tool",
                        "name": ev.tool_name,
                        "content": ev.text,
                        "tool_error": ev.error,
                    }
                    if ev.error is not None:
                        meta = dict(ev.error_meta or {})
                        meta.setdefault("available_tools", tools)
                        turn["error_meta"] = meta
                        last_error = meta
                    _add(msgs, cum, turns, turn, opts)
                else:
                    _add(msgs, cum, turns, {"role": "user", "content": ev.text}, opts)
            examples.extend(_examples(turns, stem, seg_no, opts, len(examples), tools))
    stats.n_examples += len(examples)
    return states, examples


def _add(
    msgs: list[dict[str, str]],
    cum: list[int],
    turns: list[dict[str, Any]],
    turn: dict[str, Any],
    opts: BuildOptions,
) -> None:
    """Record ``turn`` and render it into ``msgs`` (``wire.append_turn``), keeping the token prefix sums."""
    turns.append(turn)
    n = len(msgs)
    at = wire.append_turn(msgs, turn)
    if at < n:  # merged into the last message: its estimate changes
        cum.pop()
    cum.append(cum[-1] + opts.token_counter(msgs[at]["content"]))


def _turn_tokens(turn: dict[str, Any], opts: BuildOptions) -> int:
    return opts.token_counter(turn.get("content") or "")


def _examples(
    turns: list[dict[str, Any]], stem: str, seg_no: int, opts: BuildOptions, first_no: int, tools: list[str]
) -> list[dict[str, Any]]:
    """Cut one segment's turns into training examples (see docs/ingestion.md, "traces.jsonl").

    * ``episode``: from one human prompt to the next, split into chunks of at most ``example_max_tokens``
      (later chunks reopen with the prompt so that they stand alone);
    * ``error_site``: for each failed tool call followed by an assistant turn, the preceding history (within the
      budget, never across a compaction), the failure and the recovery turn, which ends the example.
    """
    out: list[dict[str, Any]] = []
    budget = opts.example_max_tokens

    def emit(kind: str, ts: list[dict[str, Any]]) -> None:
        if not any(t["role"] == "assistant" for t in ts):
            return
        ex = {
            "trace_id": stem,
            "example_id": f"{stem}#{kind}{first_no + len(out):04d}",
            "kind": kind,
            "segment": seg_no,
            "source": opts.source,
            "turns": ts,
            "dpo_pairs": None,
            "tools": tools,
            "state_ids": [t["state_id"] for t in ts if t["role"] == "assistant" and t.get("state_id")],
        }
        out.append(ex)

    # Episodes.
    starts = [i for i, t in enumerate(turns) if t["role"] == "user"]
    bounds = [s for i, s in enumerate(starts) if i == 0 or starts[i - 1] != s - 1]  # runs of user turns
    if not bounds or bounds[0] != 0:
        bounds = [0, *bounds]
    bounds.append(len(turns))
    for a, b in zip(bounds, bounds[1:], strict=False):
        opening = []
        i = a
        while i < b and turns[i]["role"] == "user":
            opening.append(turns[i])
            i += 1
        chunk, used = list(opening), sum(_turn_tokens(t, opts) for t in opening)
        for t in turns[i:b]:
            cost = _turn_tokens(t, opts)
            if (
                used + cost > budget
                and any(x["role"] == "assistant" for x in chunk)
                and t["role"] == "assistant"
            ):
                emit("episode", chunk)
                chunk, used = list(opening), sum(_turn_tokens(x, opts) for x in opening)
            chunk.append(t)
            used += cost
        emit("episode", chunk)

    # Error sites.
    for i, t in enumerate(turns):
        if t["role"] != "tool" or t.get("tool_error") is None:
            continue
        j = i + 1
        while j < len(turns) and turns[j]["role"] == "tool":
            j += 1
        if j >= len(turns) or turns[j]["role"] != "assistant":
            continue
        used = sum(_turn_tokens(x, opts) for x in turns[i : j + 1])
        k = i
        while k > 0 and used + _turn_tokens(turns[k - 1], opts) <= budget:
            k -= 1
            used += _turn_tokens(turns[k], opts)
        emit("error_site", turns[k : j + 1])
    return out


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
