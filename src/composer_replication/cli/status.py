"""Show where a run directory stands: stages, counts, spend so far, last checkpoint, report."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dir", metavar="RUN", help="a run directory written by `composer-replication run` or `demo`"
    )
    p.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args: argparse.Namespace) -> int:
    from composer_replication.pipeline import format_status, run_status

    st = run_status(args.run_dir)
    print(json.dumps(st, indent=2, default=str) if args.json else format_status(st))
    return 0
