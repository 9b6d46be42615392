"""The whole recipe, offline, on bundled example sessions: no API key, no GPU, no download.

Ingests a few real Claude Code and Codex sessions shipped with the package, replays their error sites
to in-process teachers, mines preference pairs, trains SmolLM2-135M-Instruct (offline phase, then a
short GRPO phase on bundled sandbox tasks), evaluates before and after, and writes a report.
Takes about 10 minutes on 2 quiet CPU cores, much longer when other work shares them (see
docs/quickstart.md); `--fast` about half a minute. Rerunning resumes and skips what is done.
"""

from __future__ import annotations

import argparse

from composer_replication.cli.run import TAKE_OVER, add_force_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    p.add_argument(
        "--fast",
        action="store_true",
        help="tiny random models instead of SmolLM2 (about half a minute on 2 cores; a first look)",
    )
    add_force_argument(p)


def run(args: argparse.Namespace) -> int:
    import time

    from composer_replication.pipeline import demo_config, run_pipeline

    t0 = time.time()
    origin = "composer-replication demo" + (" --fast" if args.fast else "")
    force = [f for f in args.force if f != TAKE_OVER]
    report = run_pipeline(
        demo_config(fast=args.fast), args.out, force=force, origin=origin, take_over=TAKE_OVER in args.force
    )
    print(f"demo finished in {time.time() - t0:.0f}s")
    print(f"report: {report}")
    print(f"status: composer-replication status {args.out}")
    return 0
