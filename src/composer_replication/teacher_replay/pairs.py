"""Consensus preference pairs: where enough teachers agree on an action the student did not take."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from composer_replication._io import write_jsonl_atomic

from .actions import canonical_action, teacher_vote
from .prompt import tool_names
from .types import DPOPair, TeacherCallResult, TraceState


def extract_dpo_pairs(
    states: Sequence[TraceState],
    teacher_actions: Sequence[TeacherCallResult],
    agreement_threshold: int = 2,
) -> list[DPOPair]:
    """One pair per state where at least ``agreement_threshold`` teachers gave the same canonical
    action and it differs from the student's.

    Agreement compares canonical actions (tool name + JSON arguments with sorted keys, or text with
    whitespace collapsed), so ``{"a":1,"b":2}`` and ``{"b": 2, "a": 1}`` agree, whether a teacher
    answered with ``tool_calls`` or in the text format. Failed calls and malformed responses
    (arguments that are not a JSON object, an empty or unusable name, a tool the session does not
    have, too many calls, an empty answer: ``actions.teacher_vote``) never count. A tie for
    the most-agreed action means no consensus, so no pair. ``chosen`` is the first agreeing teacher's
    original response text; ``rejected`` is the student's action.
    """
    if agreement_threshold < 1:
        raise ValueError(f"agreement_threshold must be >= 1, got {agreement_threshold}")
    by_state: dict[str, list[TeacherCallResult]] = {}
    for r in teacher_actions:
        by_state.setdefault(r["state_id"], []).append(r)
    pairs: list[DPOPair] = []
    for state in states:
        rows = [r for r in by_state.get(state["state_id"], ()) if r.get("error") is None]
        canon: list[tuple[object, TeacherCallResult]] = []
        seen_teachers: set[str] = set()
        names = tool_names(state)
        for r in rows:
            if r["teacher_slug"] in seen_teachers:  # one vote per teacher
                continue
            seen_teachers.add(r["teacher_slug"])
            c = teacher_vote(r.get("response_text"), names)[0]
            if c is not None:
                canon.append((c, r))
        if not canon:
            continue
        counts = Counter(c for c, _ in canon).most_common()
        top, n = counts[0]
        if n < agreement_threshold or (len(counts) > 1 and counts[1][1] == n):
            continue
        if top == canonical_action(state["student_action"]):
            continue
        chosen = next(r for c, r in canon if c == top)
        pair: DPOPair = {
            "state_id": state["state_id"],
            "state_messages": list(state["messages"]),
            "chosen": chosen["response_text"] or "",
            "rejected": state["student_action"],
            "n_teachers_agreeing": n,
        }
        schemas = cast("dict[str, Any]", state).get("tool_schemas")
        if schemas is not None:  # rendered with the state's tools, as the state is everywhere else
            pair["tools"] = list(schemas)
        pairs.append(pair)
    return pairs


def save_pairs(pairs: Sequence[DPOPair], path: str | os.PathLike[str]) -> None:
    """Write pairs to JSONL atomically (temp file + rename); creates parent directories."""
    write_jsonl_atomic(Path(path), pairs)
