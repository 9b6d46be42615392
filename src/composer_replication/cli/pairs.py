"""Mine preference pairs where enough teachers agree against the student.

Reads STATES (states.jsonl) and CALLS (teacher_calls.jsonl from `replay`); writes OUT (pairs JSONL,
atomically). Agreement compares canonical actions: same tool calls with the same JSON arguments (key
order ignored), or the same text up to whitespace.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

from composer_replication._io import read_jsonl

if TYPE_CHECKING:
    from composer_replication.teacher_replay.types import TeacherCallResult, TraceState


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("states", type=Path, help="states.jsonl")
    p.add_argument("calls", type=Path, help="teacher_calls.jsonl written by `replay`")
    p.add_argument("--out", type=Path, required=True, help="pairs JSONL to write")
    p.add_argument("--threshold", type=int, default=2, help="teachers that must agree (default 2)")


def run(args: argparse.Namespace) -> int:
    from composer_replication.ingestion.store import read_states
    from composer_replication.teacher_replay import extract_dpo_pairs, save_pairs

    states = cast("list[TraceState]", list(read_states(args.states)))
    calls = cast("list[TeacherCallResult]", list(read_jsonl(args.calls)))
    pairs = extract_dpo_pairs(states, calls, agreement_threshold=args.threshold)
    save_pairs(pairs, args.out)
    print(f"{len(pairs)} pairs from {len(states)} states -> {args.out}", file=sys.stderr)
    return 0
