"""Train with the three-channel loss: ``offline`` (SFT + SDPO + DPO on ingested data) or ``grpo`` (TRL).

The config (YAML/TOML/JSON; see docs/training.md) is validated before any model loads. Outputs go to
``--out``: metrics.jsonl, checkpoints/ (with optimizer state), losses.png, final_metrics.json and
final/ (a ``save_pretrained`` model + tokenizer without optimizer state; with LoRA the adapter, or the
merged weights with ``--merge``). ``--resume`` continues from the newest checkpoint there. A STOP file
in ``--out`` or SIGTERM stops the run with a checkpoint (exit 3).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="training config file (.yaml, .toml or .json)")
    p.add_argument("--out", default="runs/train", help="output directory (default: runs/train)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--mode", choices=["offline", "grpo"], help="override mode")
    p.add_argument("--model", help="override model.path (default | tiny | a directory)")
    p.add_argument("--traces", help="override data.traces")
    p.add_argument("--pairs", help="override data.pairs")
    p.add_argument("--tasks", metavar="DIR", help="override grpo.tasks: grpo mode on this task directory")
    p.add_argument("--max-steps", type=int, help="override schedule.max_steps")
    p.add_argument("--lr", type=float, help="override optimizer.lr")
    p.add_argument("--seed", type=int, help="override seed")
    p.add_argument("--objective", help="override grpo.objective")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--merge", action="store_true", help="LoRA: write merged weights to final/, not the adapter"
    )
    p.add_argument(
        "--nproc",
        type=int,
        help="offline mode on N local processes (DDP or FSDP2, see distributed.strategy); "
        "at most one per GPU, or per CPU core without GPUs",
    )


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    table = {
        "mode": "mode",
        "model": "model.path",
        "max_steps": "schedule.max_steps",
        "lr": "optimizer.lr",
        "seed": "seed",
        "objective": "grpo.objective",
    }
    out = {
        dotted: getattr(args, name) for name, dotted in table.items() if getattr(args, name, None) is not None
    }
    for name in ("traces", "pairs"):  # paths on the command line are relative to the working directory
        if getattr(args, name, None):
            out[f"data.{name}"] = str(Path(getattr(args, name)).resolve())
    if getattr(args, "tasks", None):
        out["grpo.tasks"] = str(Path(args.tasks).resolve())
    if getattr(args, "no_progress", False):
        out["logging.progress"] = False
    return out


def run(args: argparse.Namespace) -> int:
    from composer_replication.cli.validate import check_kind
    from composer_replication.config import load_config
    from composer_replication.trainer.distributed import launch as dist_launch

    check_kind(args.config, "train")  # a run config given to train: one line naming `run`
    cfg = load_config(args.config, overrides_from_args(args))  # fails here, before any model loads
    out = Path(args.out)
    launched = dist_launch.launch_env()  # a broken torchrun / accelerate environment fails here too
    if args.nproc is not None and args.nproc > 1:
        if launched is not None:
            raise ValueError("--nproc starts its own processes: drop it under torchrun / accelerate launch")
        if cfg.mode != "offline":
            raise ValueError(
                "--nproc runs the offline mode; run grpo under accelerate launch (docs/training.md)"
            )
        flags = [f for f, on in (("--resume", args.resume), ("--merge", args.merge)) if on]
        return dist_launch.run_local(cfg, args.nproc, out, flags)
    if args.nproc is not None:
        dist_launch.check_nproc(args.nproc)
    from composer_replication.safety.kill_switch import KillSwitch

    main = dist_launch.is_main_process()
    with KillSwitch(stop_file=out / "STOP", log_path=out / "kill_switch.jsonl" if main else None) as switch:
        if cfg.mode == "offline":
            from composer_replication.trainer.offline.loop import train_offline

            final = train_offline(cfg, out_dir=out, resume=args.resume, stop=switch)
            dist_launch.shutdown()
        else:
            from composer_replication.trainer.grpo.run import train_grpo

            final = train_grpo(cfg, out_dir=out, resume=args.resume, stop=switch, merge=args.merge)
    if not main:
        return 0
    from composer_replication.trainer import checkpoint as ckpt
    from composer_replication.trainer.export import describe, export_checkpoint, usage

    if cfg.mode == "offline":  # the newest checkpoint is the final weights (sharded ones too)
        latest = ckpt.latest_checkpoint(out / "checkpoints")
        exported = export_checkpoint(cfg, latest, out / "final", merge=args.merge)
    else:
        exported = describe(out / "final")
    print(json.dumps(final, indent=2, sort_keys=True))
    print(usage(exported))
    return 0
