"""Run the whole pipeline from a config file, in one resumable run directory.

Stages: ingest -> split -> replay -> pairs -> normalize -> train_offline -> train_grpo -> evaluate -> report.
A stage whose inputs and config section are unchanged since it last finished is skipped; an
interrupted stage resumes from its caches (teacher responses and the spend ledger, trainer
checkpoints, evaluation generations), so nothing is paid for twice. `composer-replication status RUN`
shows where a run stands.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from composer_replication.cli._types import non_negative_float

TAKE_OVER = "<take-over>"


def add_force_argument(p: argparse.ArgumentParser) -> None:
    """``--force [STAGE]`` (run and demo): re-run STAGE, or without STAGE take over a foreign run directory."""
    p.add_argument(
        "--force",
        action="append",
        default=[],
        nargs="?",
        const=TAKE_OVER,
        metavar="STAGE",
        help="re-run this stage even if current (repeatable); without STAGE: take over a run directory "
        "that was created by another config file",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="run config (YAML or JSON); see docs/configuration.md and examples/")
    p.add_argument("--out", help="run directory (overrides `run_dir` in the config)")
    p.add_argument(
        "--max-usd",
        dest="max_total_usd",
        type=non_negative_float,
        help="override replay.max_total_usd (the hard spend cap)",
    )
    add_force_argument(p)
    p.add_argument("--until", metavar="STAGE", help="stop after this stage")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="ingest and split, then print what replay would cost (worst case and expected) without sending anything",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set train.max_steps=2 (VALUE is parsed as JSON, else kept as text)",
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.max_steps=2")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    if args.max_total_usd is not None:
        out["replay.max_total_usd"] = args.max_total_usd
    return out


def run(args: argparse.Namespace) -> int:
    from composer_replication.pipeline import load_run_config, run_pipeline

    if Path(args.config).is_dir():
        raise IsADirectoryError(f"{args.config}: is a directory; pass the run config file (YAML or JSON)")
    from composer_replication.cli.validate import check_kind

    check_kind(args.config, "run")  # a train config given to run: one line naming `train`
    cfg = load_run_config(args.config, _overrides(args))
    run_dir = args.out or cfg.run_dir
    if not run_dir:
        raise ValueError(f"{args.config}: no run directory; set `run_dir` in the config or pass --out DIR")
    origin = str(Path(args.config).resolve())
    take_over = TAKE_OVER in args.force
    force = [f for f in args.force if f != TAKE_OVER]
    if args.dry_run:
        from composer_replication.pipeline.stages import price_replay

        price = price_replay(cfg, run_dir, origin=origin, take_over=take_over)
        print(
            f"replay would send {price['calls_to_send']} calls ({price['calls_cached']} already cached) "
            f"for {price['states']} states: expected ${price['expected_usd']:.4f}, worst case "
            f"${price['worst_case_usd']:.4f}; cap ${price['max_total_usd']:.2f}"
        )
        for slug, t in price["per_teacher"].items():
            print(
                f"  {slug:<32} {t['calls']:>5} calls  expected ${t['expected_usd']:.4f}  worst ${t['worst_usd']:.4f}"
            )
        return 0
    report = run_pipeline(cfg, run_dir, force=force, until=args.until, origin=origin, take_over=take_over)
    if report is not None:
        print(f"report: {report}")
    return 0
