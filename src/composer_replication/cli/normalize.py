"""Dedup and filter preference pairs with data-juicer.

Reads PAIRS (from `pairs`), runs the recipe (default: recipes/replaysim/default.yaml), writes OUT
(NormalizedDPOPair rows, atomically) and OUT's sibling `<stem>.report.json` with the records dropped
by each op. --skip-dj passes pairs through unchanged (no data-juicer needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from composer_replication._io import atomic_write_json, read_jsonl, write_jsonl_atomic


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pairs", type=Path, help="pairs JSONL (DPOPair rows)")
    p.add_argument("--out", type=Path, required=True, help="normalised pairs JSONL to write")
    p.add_argument("--recipe", type=Path, help="data-juicer recipe YAML (default: the bundled one)")
    p.add_argument("--skip-dj", action="store_true", help="pass through without data-juicer")


def run(args: argparse.Namespace) -> int:
    from composer_replication.replaysim import DJNormalizer

    pairs = list(read_jsonl(args.pairs))
    try:
        norm = DJNormalizer(args.recipe, skip_dj=args.skip_dj)
    except RuntimeError as exc:  # data-juicer missing: a user error with the install line
        raise ImportError(str(exc)) from None
    out = norm.normalize(pairs)
    write_jsonl_atomic(args.out, (dataclasses.asdict(p) for p in out))
    rep = norm.last_report
    assert rep is not None  # normalize() sets it
    report = {
        "records_in": rep.records_in, "records_out": rep.records_out, "dropped_by_op": rep.dropped_by_op,
        "dropped": rep.dropped, "skipped": args.skip_dj,
    }  # fmt: skip
    atomic_write_json(args.out.with_name(args.out.stem + ".report.json"), report)
    print(json.dumps({k: v for k, v in report.items() if k != "dropped"}, indent=2))
    print(f"{rep.records_out} of {rep.records_in} pairs kept -> {args.out}", file=sys.stderr)
    return 0
