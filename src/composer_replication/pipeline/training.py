"""Model resolution and the two training phases as pipeline stages (offline, then GRPO on sandbox tasks)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from composer_replication.config.run import ModelSpec
from composer_replication.models import resolve_model
from composer_replication.pipeline.runner import RunContext

# ----------------------------------------------------------------------------- models


def student_dir(ctx: RunContext) -> Path:
    spec: ModelSpec = ctx.config.student
    return resolve_model(spec.name, spec.seed, ctx.path("models"))


def final_model_dir(ctx: RunContext) -> Path:
    """The model after training: the GRPO phase's if it ran, else the offline phase's."""
    if ctx.config.grpo.enabled:
        return ctx.path("train", "grpo", "final")
    return ctx.path("train", "offline", "final")


# ----------------------------------------------------------------------------- train


def train_config(ctx: RunContext, mode: str) -> Any:
    """The trainer's ``TrainConfig`` for one phase (``RunConfig.train_config`` with the pipeline's files)."""
    pairs = ctx.path("normalize", "pairs.jsonl")
    traces = ctx.path("split", "train_traces.jsonl")
    model = student_dir(ctx) if mode == "offline" else ctx.path("train", "offline", "final")
    return ctx.config.train_config(
        mode,
        model=str(model),
        traces=str(traces) if _nonempty(traces) else None,
        pairs=str(pairs) if _nonempty(pairs) else None,
    )


def train_offline_stage(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.trainer import checkpoint as ckpt
    from composer_replication.trainer.export import export_checkpoint
    from composer_replication.trainer.offline.loop import train_offline

    out = ctx.path("train", "offline")
    if not ctx.resume and out.exists():
        shutil.rmtree(out)  # inputs or config changed: the old checkpoints belong to another run
    cfg = train_config(ctx, "offline")
    final = train_offline(cfg, out_dir=out, resume=True, stop=ctx.stop)
    # merged weights: evaluation and the GRPO phase load final/ as a plain model
    export_checkpoint(cfg, ckpt.latest_checkpoint(out / "checkpoints"), out / "final", merge=True)
    return {
        k: round(v, 5) if isinstance(v, float) else v for k, v in final.items() if isinstance(v, (int, float))
    }


def _nonempty(p: Path) -> bool:
    return p.exists() and p.stat().st_size > 0


def sandbox_pass_rate(ctx: RunContext, model_dir: Path) -> dict[str, Any]:
    """Greedy agent rollouts on the bundled tasks ``grpo.tasks`` names (all when it names a directory),
    checked by their tests in the sandbox."""
    from composer_replication.trainer.evaluation.greedy import model_fingerprint
    from composer_replication.trainer.evaluation.sandbox import sandbox_pass_rate as rate

    ec, names = ctx.config.evaluate, ctx.config.grpo.tasks
    out = ctx.path("eval", "rollouts", model_fingerprint(model_dir))
    return rate(model_dir, out, tasks=names if isinstance(names, list) else [], max_turns=ec.sandbox_max_turns,
                max_new_tokens=ec.sandbox_max_new_tokens, stop=ctx.stop)  # fmt: skip


def train_grpo_stage(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.pipeline.grpo_phase import train_grpo_on_tasks

    out = ctx.path("train", "grpo")
    if not ctx.resume and out.exists():
        shutil.rmtree(out)
    cfg = train_config(ctx, "grpo")
    summary = train_grpo_on_tasks(
        cfg, out_dir=out, tasks=grpo_tasks(ctx), resume=True, stop=ctx.stop
    )
    return {k: v for k, v in summary.items() if v is not None}


def grpo_tasks(ctx: RunContext) -> list[str] | str | None:
    """What the GRPO phase trains on: ``grpo.tasks``, else the run's tasks (``tasks`` section, with
    ``tasks.train``), else None (every bundled task)."""
    from composer_replication.config.tasks import run_task_dir

    g, tc = ctx.config.grpo, ctx.config.tasks
    if g.tasks is not None:
        return g.tasks
    if tc.enabled and tc.train:
        return str(run_task_dir(ctx.config, ctx.run_dir))
    return None
