"""The run's task stages: mine -> eval before -> (train) -> eval after, on tasks from your sessions.

    tasks/mined/        the mined task folders, report.json, mined.json     (``tasks.sessions``)
    tasks/eval_before/  eval.json report.html rollouts/                     (the student)
    tasks/eval_after/   eval.json report.html rollouts/                     (the trained model)
    tasks/before_after.json                                                 (their paired comparison)

The task set is the mined one (``tasks.sessions``), else ``tasks.dir``, else ``grpo.tasks`` when it names
a directory. Both evaluations score one model each with ``trainer.evaluation.tasks.evaluate_models`` under the
``tasks`` section's limits; ``eval_tasks_after`` compares the two task by task (``trainer.evaluation.tasks.compare``).
The GRPO phase trains on the same tasks when ``grpo.tasks`` is unset and ``tasks.train`` is on
(``pipeline.training.grpo_tasks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_json
from composer_replication.config.run import RunConfig
from composer_replication.config.tasks import MINED, run_task_dir
from composer_replication.pipeline.runner import RunContext

__all__ = [
    "eval_after_stage",
    "eval_before_stage",
    "mine_stage",
    "read_task_eval",
    "task_dir",
    "tasks_enabled",
]


def task_dir(config: RunConfig, run_dir: Path) -> Path | None:
    """The run's task directory (module docstring), or None when the run has none."""
    return run_task_dir(config, run_dir)


def tasks_enabled(config: RunConfig) -> bool:
    return run_task_dir(config, Path(".")) is not None


def mine_stage(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.tasks.build import Options
    from composer_replication.tasks.mine import mine_tasks
    from composer_replication.tasks.repo import parse_repo_map

    tc = ctx.config.tasks
    opts = Options(
        repo_map=parse_repo_map(tc.repo_map), timeout_s=tc.check_timeout_s, pip_args=list(tc.pip_args)
    )
    report = mine_tasks(tc.sessions, ctx.path(*MINED), options=opts, sandbox=tc.sandbox, log=ctx.log)
    c = report["counts"]
    if not c["tasks"]:
        reasons = (
            ", ".join(f"{n} {r}" for r, n in report["drop_reasons"].items()) or "no episode with changes"
        )
        raise ValueError(
            f"tasks.sessions: no validated task from {c['sessions']} sessions, {c['episodes']} episodes "
            f"({reasons}; every drop in tasks/mined/report.json)"
        )
    return {k: c[k] for k in ("sessions", "episodes", "tasks", "dropped")}


def _evaluate(ctx: RunContext, phase: str, model: Path) -> dict[str, Any]:
    from composer_replication.trainer.evaluation.tasks import evaluate_models

    tc = ctx.config.tasks
    tasks = task_dir(ctx.config, ctx.run_dir)
    assert tasks is not None  # the stage is enabled only with a task set
    limits = {"max_turns": tc.max_turns, "max_tokens": tc.max_tokens, "max_wall_s": tc.max_wall_s,
              "max_new_tokens": tc.max_new_tokens, "temperature": tc.temperature}  # fmt: skip
    name = "student" if phase == "before" else "trained"
    result = evaluate_models(
        tasks, ctx.path("tasks", f"eval_{phase}"), models=[str(model)], names=[name], samples=tc.samples,
        harness=tc.harness, limits=limits, sandbox=tc.sandbox, stop=ctx.stop,
        title=f"{ctx.config.report.title}: tasks {phase} training", log=ctx.log,
    )  # fmt: skip
    p = result["policies"][0]
    keep = (
        "pass@1",
        "checks_share",
        "tasks_scored",
        "infra_failures",
        "tokens_per_attempt",
        "reward_hack_attempts",
    )
    return {k: p[k] for k in keep if p[k] is not None}


def eval_before_stage(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.pipeline.training import student_dir

    return _evaluate(ctx, "before", student_dir(ctx))


def eval_after_stage(ctx: RunContext) -> dict[str, Any]:
    import json

    from composer_replication.pipeline.training import final_model_dir
    from composer_replication.trainer.evaluation.tasks import compare

    out = _evaluate(ctx, "after", final_model_dir(ctx))
    before, after = (
        json.loads(ctx.path("tasks", f"eval_{p}", "eval.json").read_text())["policies"][0]
        for p in ("before", "after")
    )
    c = compare(before, after)
    atomic_write_json(ctx.path("tasks", "before_after.json"), c)
    s = c.get("pass@1")
    if s:
        lo, hi = s["delta_ci95"]
        ci = f", 95% interval [{lo:+.3f}, {hi:+.3f}]" if lo is not None else ""
        out["pass@1"] = f"{s['a']:.3f}->{s['b']:.3f} (change {s['delta']:+.3f}{ci}, n={s['n']} tasks)"
    return out


def read_task_eval(run_dir: Path) -> dict[str, Any] | None:
    """``{"before", "after", "before_after"}`` from the run's task evaluations (None without them), for
    the report (``trainer.evaluation.task_report.run_section``)."""
    import json

    out: dict[str, Any] = {}
    for key, parts in (("before", ("eval_before", "eval.json")), ("after", ("eval_after", "eval.json")),
                       ("before_after", ("before_after.json",))):  # fmt: skip
        path = run_dir.joinpath("tasks", *parts)
        if path.is_file():
            data = json.loads(path.read_text())
            out[key] = data["policies"][0] if key != "before_after" else data
    return out or None
