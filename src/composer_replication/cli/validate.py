"""Check a config file without loading a model: unknown keys, bounds, the PO menu, data files.

Accepts both kinds: a training config (`composer-replication train`) and a run config
(`composer-replication run`). The kind is told by the top-level keys: a run config has sections a
training config does not (`sources`, `replay`, `student`, `train`, ...).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="training config or run config (.yaml, .toml or .json)")
    p.add_argument("--show", action="store_true", help="print the validated config with all defaults")


def config_kind(path: str | Path) -> str:
    """``"run"`` or ``"train"``: which kind of config ``path`` holds (by its top-level keys)."""
    from composer_replication.config import TrainConfig, read_config_file
    from composer_replication.config.run import RunConfig

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such config file" + (" (it is a directory)" if p.is_dir() else ""))
    run_only = set(RunConfig.model_fields) - set(TrainConfig.model_fields)  # sources, replay, train, ...
    return "run" if run_only & set(read_config_file(p)) else "train"


def check_kind(path: str | Path, command: str) -> None:
    """``ValueError`` with one line when ``path`` holds the other kind of config than ``command`` (``train``
    or ``run``) takes, naming the command to use. A file that is not there is left to the loader."""
    from composer_replication.config import TrainConfig, read_config_file
    from composer_replication.config.run import RunConfig

    if not Path(path).is_file():
        return
    keys = set(read_config_file(Path(path)))
    run_only = sorted(keys & (set(RunConfig.model_fields) - set(TrainConfig.model_fields)))
    train_only = sorted(keys & (set(TrainConfig.model_fields) - set(RunConfig.model_fields)))
    if command == "train" and run_only:
        raise ValueError(
            f"{path} is a run config (it has {', '.join(run_only)}), not a train config: run it with "
            f"`composer-replication run {path}`; `train` takes a train config such as examples/train_cpu.yaml"
        )
    if command == "run" and train_only and not run_only:
        raise ValueError(
            f"{path} is a train config (it has {', '.join(train_only)}), not a run config: train with "
            f"`composer-replication train {path}`; `run` takes a run config such as examples/cpu.yaml"
        )


def run(args: argparse.Namespace) -> int:
    if config_kind(args.config) == "run":
        from composer_replication.config.run import load_run_config

        rc = load_run_config(args.config)
        if args.show:
            print(rc.model_dump_json(indent=2))
        else:
            teachers = len(rc.replay.teachers) or "the 3 default"
            print(
                f"{args.config}: ok (run config: student={rc.student.name}, {teachers} teachers, "
                f"cap ${rc.replay.max_total_usd:.2f}, grpo={'on' if rc.grpo.enabled else 'off'})"
            )
        return 0
    from composer_replication.config import ConfigError, grpo_config_problems, load_config

    cfg = load_config(args.config)
    problems = grpo_config_problems(cfg) if cfg.mode == "grpo" else []
    if problems:
        raise ConfigError(f"{args.config}: grpo mode cannot honour " + "; ".join(problems))
    if args.show:
        print(cfg.model_dump_json(indent=2))
    else:
        print(f"{args.config}: ok (mode={cfg.mode}, model={cfg.model.path}, steps={cfg.schedule.max_steps})")
    return 0
