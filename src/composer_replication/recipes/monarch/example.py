"""One Composer pipeline step on a local Monarch mesh, on CPU, offline.

    python3 -m composer_replication.recipes.monarch.example [--out DIR] [--policy oracle|model]

Spawns 2 rollout/replay processes and 1 trainer process; the rollout workers solve bundled coding tasks
in the bubblewrap sandbox (oracle policy by default, or the tiny model itself), the replay worker
ingests their Claude Code session logs and asks an in-process tiny teacher for each state, and the
trainer takes one step on the successful actions and saves a checkpoint. Prints a JSON summary.
Exit code 3 when the kill switch (a STOP file in DIR, SIGTERM/SIGINT, non-finite loss) stops it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m composer_replication.recipes.monarch.example", description=__doc__
    )
    p.add_argument("--out", default=None, help="run directory (default: a new temporary directory)")
    p.add_argument("--policy", choices=["oracle", "model"], default="oracle")
    args = p.parse_args(argv)

    from composer_replication.models import build_tiny_model, build_tiny_tokenizer, save_tiny_pair
    from composer_replication.recipes.monarch.actors import run_pipeline_step
    from composer_replication.safety.kill_switch import KillSwitch, KillSwitchTriggered

    out = Path(args.out or tempfile.mkdtemp(prefix="cr-monarch-"))
    tok = build_tiny_tokenizer(2048)
    model_dir = out / "model"
    if not (model_dir / "config.json").exists():
        save_tiny_pair(model_dir, build_tiny_model(tokenizer=tok, seed=0), tok)
    teacher = {
        "slug": "local/tiny-teacher",
        "input_per_mtok": 0.0,
        "output_per_mtok": 0.0,
        "backend": "transformers",
        "model_path": str(model_dir),
        "temperature": 0.0,
    }
    with KillSwitch(stop_file=out / "STOP", log_path=out / "kill_switch.jsonl") as switch:
        try:
            summary = run_pipeline_step(
                out,
                model_dir,
                policy_dir=model_dir if args.policy == "model" else None,
                teachers=[teacher],
                stop=switch,
            )
        except KillSwitchTriggered as e:
            print(f"stopped: {e.reason}", file=sys.stderr)
            return e.exit_code
    print(
        json.dumps(
            {
                "out": str(out),
                "rollouts": [
                    {k: r[k] for k in ("rollout_id", "status", "reward", "turns")}
                    for r in summary["rollouts"]
                ],
                "states": summary["states"],
                "teacher_calls": len(summary["teacher_calls"]),
                "train": summary["train"],
                "checkpoint": summary["checkpoint"],
                "pids": summary["pids"],
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
