"""RL with signal on a CPU: GRPO on the bundled sandbox tasks with the shaped reward, under a time budget.

Runs the pipeline's online phase (``pipeline.grpo_phase.train_grpo_on_tasks``: shaped reward, SDPO at
the failed tool calls, no pairs) on ``--model`` for ``--minutes`` of training, optionally after
``--sft-steps`` offline SFT steps on the bundled sessions (the recipe's offline phase: it teaches the
``wire`` action format), and records per step the mean reward, its spread, ``frac_reward_zero_std``
(the share of groups whose completions all scored the same: no policy gradient) and the reward's
parts. Writes ``OUT/result.json`` (steps, the command, wall times, load average before and after) and
``OUT/reward.png``.

    flock /work/coord/heavy.lock python3 benchmarks/bench_grpo_signal.py --minutes 15 --out runs/grpo-signal
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--model", default="default", help="default (SmolLM2-135M-Instruct), tiny, or a directory")
    p.add_argument("--minutes", type=float, default=15.0, help="GRPO training budget (wall clock)")
    p.add_argument("--sft-steps", type=int, default=0, help="offline SFT steps on the bundled sessions first")
    p.add_argument("--sft-lr", type=float, default=1e-4)
    p.add_argument("--sft-lora-layers", type=int, default=0,
                   help="SFT a LoRA adapter (r 16) on the last N layers, merged before GRPO; 0: all weights")  # fmt: skip
    p.add_argument("--sft-seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--prompts", type=int, default=1, help="prompts per step")
    p.add_argument("--max-completion", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--objective", default="dr_grpo")
    p.add_argument("--sdpo-weight", type=float, default=0.1)
    p.add_argument("--tasks", default="", help="comma-separated bundled tasks (default: all)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _sft(a: argparse.Namespace, work: Path) -> str:
    """Offline SFT on the bundled sessions; returns the exported model directory."""
    from composer_replication.config import build_config
    from composer_replication.ingestion import ingest_paths
    from composer_replication.trainer import checkpoint as ckpt
    from composer_replication.trainer.export import export_checkpoint
    from composer_replication.trainer.offline.loop import train_offline

    sessions = ROOT / "src" / "composer_replication" / "data" / "sessions"
    ingest_paths([sessions], work / "ingest")
    cfg = build_config({
        "mode": "offline", "seed": a.seed, "model": {"path": a.model},
        "data": {"traces": str(work / "ingest" / "traces.jsonl"), "max_seq_len": a.sft_seq_len},
        "loss": {"sdpo": {"weight": 0.0}, "preference": {"weight": 0.0}},
        "optimizer": {"lr": a.sft_lr}, "schedule": {"max_steps": a.sft_steps, "batch_size": 2},
        "checkpoint": {"every_steps": a.sft_steps, "keep_last": 1}, "logging": {"progress": False, "plot": False},
        **({"lora": {"enabled": True, "r": 16, "alpha": 32, "target_modules": _last_layers(a.model, a.sft_lora_layers, work)}}
           if a.sft_lora_layers else {}),
    })  # fmt: skip
    train_offline(cfg, out_dir=work / "sft", resume=True)
    export_checkpoint(
        cfg, ckpt.latest_checkpoint(work / "sft" / "checkpoints"), work / "sft" / "final", merge=True
    )
    return str(work / "sft" / "final")


def _last_layers(model: str, n: int, work: Path) -> str:
    """PEFT ``target_modules``: the projections of ``model``'s last ``n`` blocks."""
    import json

    from composer_replication.models import resolve_model

    total = int(
        json.loads((resolve_model(model, tiny_dir=work) / "config.json").read_text())["num_hidden_layers"]
    )
    ids = "|".join(str(i) for i in range(max(0, total - n), total))
    return rf".*\.layers\.({ids})\.(self_attn|mlp)\.\w+_proj"


def _deadline(seconds: float) -> Any:
    """A stop (``safety.as_stop``) that fires once the wall-clock budget is spent (polled after each step)."""
    end = time.monotonic() + seconds
    return lambda: "time budget spent" if time.monotonic() > end else None


def _slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against the step index."""
    n = len(ys)
    mx, my = (n - 1) / 2, sum(ys) / n
    den = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / den if den else 0.0


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from composer_replication.config import build_config
    from composer_replication.pipeline.grpo_phase import train_grpo_on_tasks
    from composer_replication.pipeline.report import _is_reward, _line_plot, _series
    from composer_replication.safety.kill_switch import KillSwitchTriggered
    from composer_replication.trainer.plots import pyplot

    a.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"command": " ".join(["benchmarks/bench_grpo_signal.py", *sys.argv[1:]]),
                              "load_before": os.getloadavg(), "cpus": os.cpu_count(), "args": vars(a) | {"out": str(a.out)}}  # fmt: skip
    t0 = time.monotonic()
    model = _sft(a, a.out) if a.sft_steps else a.model
    result["sft_seconds"] = time.monotonic() - t0
    empty = a.out / "no_traces.jsonl"
    empty.write_text("")
    cfg = build_config({
        "mode": "grpo", "seed": a.seed, "model": {"path": model},
        "data": {"traces": str(empty), "max_seq_len": 2048},  # the phase reads tasks, not traces
        "loss": {"sdpo": {"weight": a.sdpo_weight}, "preference": {"weight": 0.0}},
        "optimizer": {"lr": a.lr}, "schedule": {"max_steps": 10_000, "batch_size": a.prompts},
        "checkpoint": {"every_steps": 0, "keep_last": 1}, "logging": {"progress": False, "plot": False},
        "grpo": {"objective": a.objective, "num_generations": a.generations,
                 "max_completion_length": a.max_completion, "temperature": a.temperature},
    })  # fmt: skip
    t1 = time.monotonic()
    tasks = [t for t in a.tasks.split(",") if t]
    try:
        train_grpo_on_tasks(
            cfg, out_dir=a.out / "grpo", tasks=tasks, resume=False, kill_switch=_deadline(a.minutes * 60)
        )
    except KillSwitchTriggered:
        pass  # the time budget: metrics.jsonl holds every step taken
    result["grpo_seconds"] = time.monotonic() - t1
    rows = [json.loads(x) for x in (a.out / "grpo" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    keep = ("step", "reward", "reward_std", "frac_reward_zero_std", "sdpo/tokens", "step_time")
    result["steps"] = [{k: r[k] for k in r if k in keep or k.startswith("reward_parts/")} for r in rows]
    result["load_after"] = os.getloadavg()
    rewards = [r["reward"] for r in rows]
    if rewards:
        k = max(1, len(rewards) // 4)
        result["reward_first_quarter"] = sum(rewards[:k]) / k
        result["reward_last_quarter"] = sum(rewards[-k:]) / k
        result["frac_reward_zero_std_mean"] = sum(r["frac_reward_zero_std"] for r in rows) / len(rows)
        result["reward_slope_per_step"] = _slope(rewards)
    (a.out / "result.json").write_text(json.dumps(result, indent=2))
    _line_plot(
        pyplot(), _series(rows, _is_reward), "GRPO on the sandbox tasks", "reward", a.out / "reward.png"
    )
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
