"""``eval TASKS --model A [--model B]``: models and built-in policies on a task set, compared task by task.

`evaluate_models` builds the policies (``--policy reference|noop`` and each ``--model``, a
``tasks.agent.AgentPolicy``), scores them with ``tasks.evaluate.evaluate`` (one rollout per task x sample
in the task's harness, scored by the verifier), adds the paired comparisons and writes ``DIR/eval.json``
and ``DIR/report.html`` (`trainer.evaluation.task_report`). `compare(a, b)` is the paired per-task difference of
two policies' entries (``b - a`` per task, with the 95% t interval of ``evaluation.paired.paired``) over
the tasks both scored: with two models, each later model against the first; the pipeline's
``eval_tasks_after`` stage compares the trained model with the student the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_json

__all__ = ["compare", "evaluate_models"]

METRICS = ("pass@1", "checks_share")


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None  # one task: no interval (JSON has no NaN)
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return round(x, 4) if isinstance(x, float) else x


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Policy ``b`` against policy ``a`` (two ``eval.json`` policy entries), per task both scored:
    for ``pass@1`` and ``checks_share`` the means, the mean per-task difference ``delta`` (b - a), its
    standard deviation and 95% interval, and ``n`` tasks; ``rows`` per task; ``tasks_left_out`` (a task
    without a score on either side)."""
    from composer_replication.trainer.evaluation.paired import paired

    ra, rb = ({r["task"]: r for r in p["rows"]} for p in (a, b))
    common = [t for t in ra if t in rb and ra[t]["scored"] and rb[t]["scored"]]
    out: dict[str, Any] = {"a": a["name"], "b": b["name"], "n_tasks": len(common),
                           "tasks_left_out": sorted((set(ra) | set(rb)) - set(common))}  # fmt: skip
    for m in METRICS:
        both = [t for t in common if ra[t][m] is not None and rb[t][m] is not None]
        if both:
            s = paired([ra[t][m] for t in both], [rb[t][m] for t in both])
            out[m] = {"a": s["before"], "b": s["after"], **{k: s[k] for k in ("delta", "delta_std", "n")},
                      "delta_ci95": s["delta_ci95"]}  # fmt: skip
            out[m] = {k: _finite(v) for k, v in out[m].items()}
    out["rows"] = [
        {"task": t, **{f"{m}_{side}": r[t][m] for m in METRICS for side, r in (("a", ra), ("b", rb))}}
        for t in common
    ]
    return out


def _policies(
    builtins: Sequence[str],
    models: Sequence[str],
    names: Sequence[str],
    limits: dict[str, Any],
    log: Callable[[str], None],
) -> list[Any]:
    from composer_replication.tasks.agent import model_policy
    from composer_replication.tasks.evaluate import NoopPolicy, ReferencePolicy

    dup = sorted({m for m in names if list(names).count(m) > 1})
    if dup:
        raise ValueError(f"--model {dup[0]} is given twice: each model is scored once")
    made: dict[str, Any] = {"reference": ReferencePolicy(), "noop": NoopPolicy()}
    out = [made[p] for p in dict.fromkeys(builtins)]
    for spec, name in zip(models, names, strict=True):
        log(f"loading model {spec}")
        out.append(model_policy(spec, name=name, **limits))
    return out


def evaluate_models(
    tasks_dir: str | Path,
    out_dir: str | Path,
    *,
    models: Sequence[str] = (),
    names: Sequence[str] | None = None,
    policies: Sequence[str] = (),
    samples: int = 1,
    harness: str | None = None,
    limits: dict[str, Any] | None = None,
    sandbox: Any = None,
    env_cache: Any = None,
    stop: Any = None,
    title: str = "eval",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Score the built-in ``policies`` and the ``models`` (named ``names``, default the specs themselves)
    on ``tasks_dir``; write ``out_dir/eval.json`` (with ``comparisons``) and ``out_dir/report.html``.
    ``limits``: each model's limits and sampling,
    ``tasks.agent.model_policy``'s keywords (``max_turns``, ``max_tokens``, ``max_wall_s``,
    ``max_new_tokens``, ``temperature``, ``endpoint_model``)."""
    from composer_replication.tasks.evaluate import EVAL_FILE, evaluate
    from composer_replication.trainer.evaluation.task_report import write_eval_report

    if not models and not policies:
        raise ValueError("nothing to score: give --model and/or --policy")
    chosen = _policies(policies, models, list(names or models), dict(limits or {}), log)
    result = evaluate(tasks_dir, chosen, out_dir, samples=samples, sandbox=sandbox, env_cache=env_cache,
                      harness=harness, stop=stop, log=log)  # fmt: skip
    agents = [p for p in result["policies"] if p["kind"] == "model"]
    result["comparisons"] = [compare(agents[0], b) for b in agents[1:]]
    atomic_write_json(Path(out_dir) / EVAL_FILE, result)
    write_eval_report(result, Path(out_dir), title=title)
    return result
