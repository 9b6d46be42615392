"""Check a training config without loading a model: unknown keys, bounds, the PO menu, data files."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="training config file (.yaml, .toml or .json)")
    p.add_argument("--show", action="store_true", help="print the validated config with all defaults")


def run(args: argparse.Namespace) -> int:
    from composer_replication.config import load_config

    cfg = load_config(args.config)
    if args.show:
        print(cfg.model_dump_json(indent=2))
    else:
        print(f"{args.config}: ok (mode={cfg.mode}, model={cfg.model.path}, steps={cfg.schedule.max_steps})")
    return 0
