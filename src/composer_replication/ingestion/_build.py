"""Conversations -> traces (turns, stored once) + state and example references into them.

A :class:`Trace` is one conversation as ``TraceTurn`` dicts (the ``TraceExample`` turn shape): ``user``,
``context`` (harness-injected text the model saw: command expansions, Skill bodies, attachments), ``assistant``
(``content`` = the action as the history shows it, ``tool_call(s)``, ``state_id``) and ``tool``. A state is a
reference ``{"state_id", "trace_id", "turn", "from"?, "error_kind"?}``: the assistant turn it predicts and, when
``max_history_tokens`` cut the history, the first turn kept. Its ``messages`` are
``[system] + wire.turns_to_messages(turns[from:turn])`` (``from`` defaults to the start of the turn's segment),
materialised on demand by :mod:`composer_replication.ingestion.store`; traces, examples and states carry the
session's ``tools`` (names) and ``tool_schemas`` (``tool_schemas.tools_for`` of the calls the session logged). An example is a reference
``{"example_id", "trace_id", "kind", "segment", "span": [a, b], "open": [...]}``: turns ``open + [a, b)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from composer_replication import tool_schemas, wire
from composer_replication.ingestion._session import (
    BuildOptions,
    Conversation,
    Event,
    IngestionStats,
    mark_repeats,
    render_action,
)

USER_SIDE = frozenset({"user", "context"})


@dataclass
class Trace:
    """One conversation, assembled: its turns, per-turn actions, segment starts and the references into it."""

    trace_id: str
    source: str
    tools: list[str]
    system: str
    tool_schemas: list[dict[str, Any]] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    actions: dict[int, str] = field(default_factory=dict)  # turn index -> student action (thinking kept)
    seg_starts: list[int] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def segment_of(self, turn: int) -> int:
        seg = 0
        for i, s in enumerate(self.seg_starts):
            if s <= turn:
                seg = i
        return seg

    def segment_start(self, turn: int) -> int:
        return self.seg_starts[self.segment_of(turn)] if self.seg_starts else 0


def conversation_tools(conv: Conversation) -> list[str]:
    return sorted({b.name for seg in conv.segments for ev in seg if ev.blocks for b in ev.blocks if b.name})


def conversation_schemas(
    conv: Conversation, tools: list[str], source: str, stats: IngestionStats
) -> list[dict[str, Any]]:
    """The schemas of ``tools`` (in that order) from the inputs the conversation logged for each; a
    logged input the schema still disagrees with (a type, a missing required key) is counted in
    ``stats`` under one line naming the source, the tool and the argument."""
    seen: dict[str, list[Any]] = {t: [] for t in tools}
    for seg in conv.segments:
        for ev in seg:
            for b in ev.blocks or []:
                if b.kind == "tool_use" and b.name in seen:
                    seen[b.name].append(b.input)
    schemas = tool_schemas.tools_for(source, seen)
    for schema, inputs in zip(schemas, seen.values(), strict=True):
        for args in inputs:
            problems = tool_schemas.input_problems(schema, args)
            stats.n_schema_mismatches += bool(problems)
            for p in problems:
                key = f"{source} {p}"
                stats.schema_mismatches[key] = stats.schema_mismatches.get(key, 0) + 1
    return schemas


def build_traces(
    conversations: list[Conversation], base_id: str, opts: BuildOptions, stats: IngestionStats
) -> list[Trace]:
    """Assemble every conversation of one file into a :class:`Trace` with its state and example references."""
    out = []
    for conv in conversations:
        trace = _build_one(conv, base_id + conv.suffix, opts, stats)
        out.append(trace)
    return out


def _build_one(conv: Conversation, trace_id: str, opts: BuildOptions, stats: IngestionStats) -> Trace:
    tools = conversation_tools(conv)
    system = opts.system_prompt
    schemas = conversation_schemas(conv, tools, opts.source, stats)
    trace = Trace(trace_id, opts.source, tools, system, schemas, meta=dict(conv.meta))
    # the system turn shows the tools too (the chat template lists their schemas)
    sys_tokens = opts.token_counter(system) + opts.token_counter(json.dumps(schemas, ensure_ascii=False))
    budget = None if opts.max_history_tokens is None else opts.max_history_tokens - sys_tokens
    turns = trace.turns
    idx = 0
    for seg_no, seg in enumerate(conv.segments):
        mark_repeats(seg)
        for ev in seg:
            if ev.kind == "tool" and ev.error_kind:
                stats.error_kinds[ev.error_kind] = stats.error_kinds.get(ev.error_kind, 0) + 1
        seg_start = len(turns)
        trace.seg_starts.append(seg_start)
        msgs: list[dict[str, Any]] = []
        cum = [0]  # prefix sums of token estimates over msgs
        first_turn: list[int] = []  # per message: the turn that opened it
        start = 0
        last_error: dict[str, Any] | None = None
        for ev in seg:
            if ev.kind == "assistant":
                stats.n_assistant_turns += 1
                action = render_action(ev.blocks or [], thinking=True)
                sid = f"{trace_id}::{idx:04d}"
                if action:
                    idx += 1
                    ref: dict[str, Any] = {"state_id": sid, "trace_id": trace_id, "turn": len(turns)}
                    if budget is not None and msgs:
                        while start < len(msgs) - 1 and cum[-1] - cum[start] > budget:
                            start += 1
                        if start > 0:
                            stats.n_history_truncated += 1
                            ref["from"] = first_turn[start]
                    if last_error is not None:
                        ref["error_kind"] = last_error["error_kind"]
                    trace.states.append(ref)
                    trace.actions[len(turns)] = action
                    stats.n_states_emitted += 1
                else:
                    stats.n_empty_turns += 1
                last_error = None
                turn = _assistant_turn(ev, action, sid if action else None, opts)
            elif ev.kind == "tool":
                turn = _tool_turn(ev, tools)
                last_error = turn.get("error_meta", last_error)
            elif ev.kind == "context":
                turn = {"role": "context", "kind": ev.context_kind, "content": ev.text}
            else:
                # A person spoke after the failure: the next turn answers them, not the error.
                last_error = None
                turn = {"role": "user", "content": ev.text}
            if budget is None:
                turns.append(turn)  # no history budget: the rendered messages are not needed here
            else:
                _add(msgs, cum, first_turn, turns, turn, opts)
        trace.examples.extend(_examples(turns, seg_start, trace_id, seg_no, opts, len(trace.examples)))
    stats.n_examples += len(trace.examples)
    return trace


def _assistant_turn(ev: Event, action: str, sid: str | None, opts: BuildOptions) -> dict[str, Any]:
    """The assistant turn of event ``ev``: its action as the history shows it (thinking stripped when
    ``opts.strip_thinking``), its tool calls and the state it is (``sid``, None for an empty action)."""
    blocks = ev.blocks or []
    hist = action
    if opts.strip_thinking and any(b.kind == "thinking" for b in blocks):
        hist = render_action(blocks, thinking=False)
    calls = [
        {"name": b.name, "arguments": b.input, **({"id": b.id} if b.id else {})}
        for b in blocks
        if b.kind == "tool_use"
    ]
    return {
        "role": "assistant",
        "content": hist,
        "tool_call": calls[0] if calls else None,
        "tool_calls": calls,
        "state_id": sid,
    }


def _tool_turn(ev: Event, tools: list[str]) -> dict[str, Any]:
    """The tool turn of event ``ev``; a failed call carries ``error_meta`` (with the session's tools)."""
    turn: dict[str, Any] = {"role": "tool", "name": ev.tool_name, "content": ev.text, "tool_error": ev.error}
    if ev.tool_use_id:
        turn["tool_call_id"] = ev.tool_use_id
    if ev.agent_id:
        turn["agent_id"] = ev.agent_id
    if ev.error is not None:
        meta = dict(ev.error_meta or {})
        meta.setdefault("available_tools", tools)
        turn["error_meta"] = meta
    return turn


def _add(
    msgs: list[dict[str, Any]],
    cum: list[int],
    first_turn: list[int],
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
    else:
        first_turn.append(len(turns) - 1)
    m = msgs[at]
    calls = "".join(c["function"]["arguments"] for c in m.get("tool_calls") or [])  # what the calls add
    cum.append(cum[-1] + opts.token_counter(m["content"] + calls))


def _tokens(turn: dict[str, Any], opts: BuildOptions) -> int:
    return opts.token_counter(turn.get("content") or "")


def _examples(
    all_turns: list[dict[str, Any]],
    seg_start: int,
    trace_id: str,
    seg_no: int,
    opts: BuildOptions,
    first_no: int,
) -> list[dict[str, Any]]:
    """Cut one segment's turns into example references (see docs/ingestion.md, "traces.jsonl"): the
    ``episode`` chunks of :func:`_episode_spans`, then the ``error_site`` spans of :func:`_error_site_spans`
    (numbered from ``first_no``); a span without an assistant turn is left out."""
    turns = all_turns[seg_start:]
    budget = opts.example_max_tokens
    tok = [_tokens(t, opts) for t in turns]  # each turn's estimate, once (error sites reuse them)
    spans = [("episode", *s) for s in _episode_spans(turns, tok, budget)]
    spans += [("error_site", [], a, b) for a, b in _error_site_spans(turns, tok, budget)]
    out: list[dict[str, Any]] = []
    for kind, opening, a, b in spans:
        if not any(turns[i]["role"] == "assistant" for i in (*opening, *range(a, b))):
            continue
        ref: dict[str, Any] = {
            "example_id": f"{trace_id}#{kind}{first_no + len(out):04d}",
            "trace_id": trace_id,
            "kind": kind,
            "segment": seg_no,
            "span": [seg_start + a, seg_start + b],
        }
        if opening:
            ref["open"] = [seg_start + i for i in opening]
        out.append(ref)
    return out


def _episode_spans(
    turns: list[dict[str, Any]], tok: list[int], budget: int
) -> list[tuple[list[int], int, int]]:
    """``(opening, a, b)`` per episode chunk: a run of user-side turns (user text, harness context) holding a
    human prompt opens an episode; one longer than ``budget`` tokens is cut before an assistant turn, and
    each later chunk reopens with the episode's opening turns."""
    bounds = []
    i = 0
    while i < len(turns):
        if turns[i]["role"] in USER_SIDE:
            j = i
            while j < len(turns) and turns[j]["role"] in USER_SIDE:
                j += 1
            if any(t["role"] == "user" for t in turns[i:j]):
                bounds.append(i)
            i = j
        else:
            i += 1
    if not bounds or bounds[0] != 0:
        bounds = [0, *bounds]
    bounds.append(len(turns))
    spans: list[tuple[list[int], int, int]] = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        i = a
        while i < b and turns[i]["role"] in USER_SIDE:
            i += 1
        opening = list(range(a, i))
        cost0 = sum(tok[k] for k in opening)
        chunk_start, used, has_asst = a, cost0, False
        for k in range(i, b):
            cost = tok[k]
            if used + cost > budget and has_asst and turns[k]["role"] == "assistant":
                spans.append(([] if chunk_start == a else opening, chunk_start, k))
                chunk_start, used, has_asst = k, cost0, False
            used += cost
            has_asst = has_asst or turns[k]["role"] == "assistant"
        spans.append(([] if chunk_start == a else opening, chunk_start, b))
    return spans


def _error_site_spans(turns: list[dict[str, Any]], tok: list[int], budget: int) -> list[tuple[int, int]]:
    """``(a, b)`` per failed tool call followed (past other results and harness context) by an assistant
    turn: the history before it within ``budget`` tokens, the failure, and the recovery turn (ending it)."""
    spans = []
    for i, t in enumerate(turns):
        if t["role"] != "tool" or t.get("tool_error") is None:
            continue
        j = i + 1
        while j < len(turns) and turns[j]["role"] in ("tool", "context"):
            j += 1
        if j >= len(turns) or turns[j]["role"] != "assistant":
            continue
        used = sum(tok[i : j + 1])
        k = i
        while k > 0 and used + tok[k - 1] <= budget:
            k -= 1
            used += tok[k]
        spans.append((k, j + 1))
    return spans


def example_turns(trace: Trace, ref: dict[str, Any]) -> list[dict[str, Any]]:
    a, b = ref["span"]
    return [trace.turns[i] for i in ref.get("open", ())] + trace.turns[a:b]


def example_row(trace: Trace, ref: dict[str, Any]) -> dict[str, Any]:
    """The ``TraceExample`` a reference stands for."""
    turns = example_turns(trace, ref)
    return {
        "trace_id": trace.trace_id,
        "example_id": ref["example_id"],
        "kind": ref["kind"],
        "segment": ref["segment"],
        "source": trace.source,
        "turns": turns,
        "dpo_pairs": None,
        "tools": trace.tools,
        "tool_schemas": trace.tool_schemas,
        "state_ids": [t["state_id"] for t in turns if t["role"] == "assistant" and t.get("state_id")],
    }


def state_rows(trace: Trace, refs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``TraceState`` rows of ``refs`` (all of one trace, any order), in one pass over the turns.

    Consecutive states share their message dicts (``wire.append_turn`` never mutates a message it merged
    into), so a long session costs one copy of its messages, not one per state.
    """
    if not refs:
        return []
    system = {"role": "system", "content": trace.system}
    wanted = sorted(refs, key=lambda r: r["turn"])
    out: dict[int, dict[str, Any]] = {}
    ordinal = {r["state_id"]: n for n, r in enumerate(trace.states)}
    w = 0
    for seg_no, seg_start in enumerate(trace.seg_starts):
        seg_end = trace.seg_starts[seg_no + 1] if seg_no + 1 < len(trace.seg_starts) else len(trace.turns)
        if w < len(wanted) and wanted[w]["turn"] >= seg_end:
            continue
        msgs: list[dict[str, Any]] = []
        first_turn: list[int] = []
        for k in range(seg_start, seg_end):
            while w < len(wanted) and wanted[w]["turn"] == k:
                ref = wanted[w]
                frm = ref.get("from", seg_start)
                m0 = next(i for i, t in enumerate(first_turn) if t >= frm) if frm > seg_start else 0
                messages = [system, *msgs[m0:]]
                last = ref.get("last")
                if (
                    last is not None
                ):  # the replay stage's history_messages (same slice as before: 0 keeps all)
                    messages = [system, *messages[1:][-last:]]
                row: dict[str, Any] = {
                    "state_id": ref["state_id"],
                    "messages": messages,
                    "student_action": trace.actions[k],
                    "trace_id": trace.trace_id,
                    "turn_index": ordinal.get(ref["state_id"], 0),
                    "source": trace.source,
                    "tools": trace.tools,
                    "tool_schemas": trace.tool_schemas,
                }
                if "error_kind" in ref:
                    row["error_kind"] = ref["error_kind"]
                out[id(ref)] = row
                w += 1
            n = len(msgs)
            if wire.append_turn(msgs, trace.turns[k]) >= n:
                first_turn.append(k)
        if w >= len(wanted):
            break
    return [out[id(r)] for r in refs if id(r) in out]
