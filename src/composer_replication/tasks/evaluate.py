"""``eval``: score a policy on a task set with the project's verifier; write ``DIR/eval.json``.

A *policy* acts on one task in a sandbox that holds the task's starting files (`Policy.act`); then the
verifier (`datagen.verifier.verify`) reads what changed in that sandbox and runs the task's checks on a
fresh copy of the task's files plus the non-protected changes. A model is an *agent* (`Agent.attempt`,
`tasks.agent.AgentPolicy`): each attempt is a rollout (`datagen.rollout.run_rollout`) in the task's
harness (its provenance's ``source``, else ``harness``) with limits on turns, tokens and wall time,
written as a session log under ``out_dir/rollouts/<policy>/``, and scored by the same verifier. Built in:

- ``reference``: writes the task's reference solution (and deletes what it deletes) — must solve every
  validated task;
- ``noop``: changes nothing — must solve no task whose checks include a FAIL_TO_PASS one.

Per policy: ``pass@1`` (the mean, over tasks, of the share of samples that solved the task), ``pass@K``
(unbiased estimator over ``samples``), the share of checks passing, turns and tokens, reward-hack
attempts (attempts that touched a protected path), and one row per task. An infrastructure failure (the
sandbox could not start or broke, the model's endpoint failed) is counted apart and left out of every
rate, never scored 0. A task folder that cannot be loaded is named with its reason and counted.
"""

from __future__ import annotations

import math
import os
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from composer_replication._io import atomic_write_json
from composer_replication.datagen.harness import HARNESSES
from composer_replication.datagen.sandbox import Sandbox, SandboxError, make_sandbox
from composer_replication.datagen.tasks import Task, load_task
from composer_replication.tasks import environment as envmod

EVAL_FILE = "eval.json"


@dataclass
class Action:
    """What a policy reports about one attempt (a model policy fills turns and tokens)."""

    turns: int = 0
    tokens: int = 0


class Policy(Protocol):
    name: str

    def act(self, task: Task, sandbox: Sandbox) -> Action: ...


class Agent(Protocol):
    """A policy that runs whole attempts itself (a model: `tasks.agent.AgentPolicy`) and returns the
    attempt's row (`run_task`'s keys, plus ``end_reason`` and ``session_log``)."""

    name: str

    def attempt(
        self, task: Task, *, sandbox: Any, harness: str | None, rollout_id: str, log_dir: Path, stop: Any
    ) -> dict[str, Any]: ...


@dataclass
class ReferencePolicy:
    """Writes the reference solution; ``deleted`` names the files each task's reference deletes."""

    deleted: dict[str, list[str]] = field(default_factory=dict)
    name: str = "reference"

    def act(self, task: Task, sandbox: Sandbox) -> Action:
        for path, text in task.solution.items():
            sandbox.put(path, text)
        gone = self.deleted.get(task.name, [])
        if gone:
            import shlex

            sandbox.exec("rm -f -- " + " ".join(shlex.quote(p) for p in gone), timeout=60)
        return Action()


@dataclass
class NoopPolicy:
    """Changes nothing."""

    name: str = "noop"

    def act(self, task: Task, sandbox: Sandbox) -> Action:
        return Action()


def load_task_dir(root: str | Path, say: Callable[[str], None]) -> tuple[list[Task], dict[str, Any]]:
    """Every loadable task under ``root`` and ``{"malformed": [...], "deleted": {task: [paths]}}``; each
    folder that cannot be loaded gets one line naming it and the reason."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such tasks directory (make one with `tasks mine --out {root}`)")
    tasks: list[Task] = []
    extra: dict[str, Any] = {"malformed": [], "deleted": {}, "environment": {}, "source": {}}
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or not d.is_dir():
            continue
        if not (os.path.lexists(d / "task.json") or os.path.lexists(d / "task.toml")):
            continue
        try:
            task = load_task(d)
        except (ValueError, OSError) as e:
            extra["malformed"].append({"task": d.name, "reason": str(e)})
            say(f"task {d.name}: skipped: {e}")
            continue
        tasks.append(task)
        data = _toml(d)
        gone = _table(data, "solution").get("deleted", [])
        extra["deleted"][task.name] = (
            [p for p in gone if isinstance(p, str)] if isinstance(gone, list) else []
        )
        extra["environment"][task.name] = _table(data, "environment")
        source = _table(data, "metadata").get("source")
        extra["source"][task.name] = source if source in HARNESSES else None
    return tasks, extra


def _toml(d: Path) -> dict[str, Any]:
    try:
        return tomllib.loads((d / "task.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # the task.json layout


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    t = data.get(key)
    return t if isinstance(t, dict) else {}


def task_sandbox(recipe: dict[str, Any], sandbox: Any = None, cache: Any = None) -> Any:
    """The sandbox spec for a task whose checks need a prepared environment (its ``[environment]`` table
    ``recipe``; prepared here, into ``cache``, if missing). Raises `SandboxError` when it cannot be."""
    env = envmod.from_recipe(recipe)
    envmod.prepare(env, cache or envmod.default_cache())
    if env.error:
        raise SandboxError(env.error)
    return envmod.sandbox_spec(env, sandbox)


def run_task(task: Task, policy: Policy, *, sandbox: Any = None) -> dict[str, Any]:
    """One attempt: the policy acts in a fresh sandbox holding ``task.files``, then the verifier scores it."""
    from composer_replication.datagen.verifier import verify

    t0 = time.monotonic()
    factory = sandbox if callable(sandbox) else (lambda: make_sandbox(sandbox))
    try:
        with factory() as sb:
            for path, text in task.files.items():
                sb.put(path, text)
            action = policy.act(task, sb)
            verdict = verify(task, sb, sandbox=sandbox)
    except SandboxError as e:
        return {"infra_error": f"SandboxError: {e}", "seconds": round(time.monotonic() - t0, 2)}
    row: dict[str, Any] = {
        "seconds": round(time.monotonic() - t0, 2),
        "turns": action.turns,
        "tokens": action.tokens,
    }
    if verdict.infra_error is not None:
        return {**row, "infra_error": verdict.infra_error}
    return {
        **row,
        "solved": verdict.solved,
        "checks_passed": sum(c.passed for c in verdict.checks),
        "checks": len(verdict.checks),
        "tests_fraction": verdict.tests_fraction,
        "protected_touched": verdict.protected_touched,
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(
    tasks_dir: str | Path,
    policies: Sequence[Policy | Agent],
    out_dir: str | Path,
    *,
    samples: int = 1,
    sandbox: Any = None,
    env_cache: Any = None,
    harness: str | None = None,
    stop: Any = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Score each policy on every task of ``tasks_dir`` (module docstring); writes ``out_dir/eval.json``.
    ``harness``: an agent's harness for tasks whose provenance names none; ``stop`` (a kill switch) is
    polled between an agent's turns."""
    if samples < 1:
        raise ValueError(f"samples={samples}: must be at least 1")
    tasks, extra = load_task_dir(tasks_dir, log)
    if not tasks:
        raise FileNotFoundError(
            f"{tasks_dir}: no loadable task folders ({len(extra['malformed'])} malformed)"
        )
    result: dict[str, Any] = {"tasks_dir": str(tasks_dir), "n_tasks": len(tasks), "samples": samples,
                              "malformed": extra["malformed"], "policies": []}  # fmt: skip
    logs = _log_dirs(policies)
    for policy in policies:
        if isinstance(policy, ReferencePolicy) and not policy.deleted:
            policy.deleted = extra["deleted"]
        log_dir = Path(out_dir) / "rollouts" / logs[id(policy)]
        rows = []
        for task in tasks:
            how = extra["source"].get(task.name) or harness
            try:
                spec = task_sandbox(extra["environment"].get(task.name, {}), sandbox, env_cache)
            except SandboxError as e:
                attempts = [{"infra_error": f"environment: {e}", "seconds": 0.0}] * samples
            else:
                attempts = [
                    _attempt(task, policy, i, spec=spec, harness=how, log_dir=log_dir, stop=stop)
                    for i in range(samples)
                ]
            rows.append(_row(task.name, attempts, samples) | ({"harness": how} if _is_agent(policy) else {}))
            r = rows[-1]
            state = "infra error" if r["scored"] == 0 else f"{r['solved']}/{r['scored']} solved"
            log(f"{policy.name}: {task.name}: {state}, checks {r['checks_share']}")
        kind = (
            {"kind": "model", "rollouts": f"rollouts/{logs[id(policy)]}"}
            if _is_agent(policy)
            else {"kind": "built-in"}
        )
        result["policies"].append({"name": policy.name, **kind, **_summary(rows, samples), "rows": rows})
    atomic_write_json(Path(out_dir) / EVAL_FILE, result)
    return result


def _is_agent(policy: Any) -> bool:
    return callable(getattr(policy, "attempt", None))


def _log_dirs(policies: Sequence[Policy | Agent]) -> dict[int, str]:
    """A distinct folder name under ``rollouts/`` per policy (its name, made safe; ``-2``... on a clash)."""
    from composer_replication.tasks.layout import safe_component

    out: dict[int, str] = {}
    for p in policies:
        base = name = safe_component(p.name, 60)
        n = 2
        while name in out.values():
            name, n = f"{base}-{n}", n + 1
        out[id(p)] = name
    return out


def _attempt(
    task: Task, policy: Policy | Agent, i: int, *, spec: Any, harness: str | None, log_dir: Path, stop: Any
) -> dict[str, Any]:
    if not _is_agent(policy):
        return run_task(task, policy, sandbox=spec)  # type: ignore[arg-type]
    return policy.attempt(  # type: ignore[union-attr]
        task, sandbox=spec, harness=harness, rollout_id=f"{task.name}-{i:03d}", log_dir=log_dir, stop=stop
    )


def _row(name: str, attempts: list[dict[str, Any]], k: int) -> dict[str, Any]:
    scored = [a for a in attempts if "infra_error" not in a]
    c = sum(bool(a["solved"]) for a in scored)
    checks = sum(a["checks"] for a in scored)
    return {
        "task": name,
        "scored": len(scored),
        "infra_errors": [a["infra_error"] for a in attempts if "infra_error" in a],
        "solved": c,
        "pass@1": c / len(scored) if scored else None,
        f"pass@{k}": pass_at_k(len(scored), c, k) if len(scored) >= k else None,
        "checks_share": round(sum(a["checks_passed"] for a in scored) / checks, 4) if checks else None,
        "turns": sum(a.get("turns", 0) for a in scored),
        "tokens": sum(a.get("tokens", 0) for a in scored),
        "protected_touched": sorted({p for a in scored for p in a["protected_touched"]}),
        "reward_hack_attempts": sum(bool(a["protected_touched"]) for a in scored),
        "end_reasons": dict(Counter(a["end_reason"] for a in attempts if a.get("end_reason"))),
        "seconds": round(sum(a["seconds"] for a in attempts), 2),
    }


def _summary(rows: list[dict[str, Any]], k: int) -> dict[str, Any]:
    scored = [r for r in rows if r["scored"]]
    n_attempts = sum(r["scored"] for r in rows)

    def mean(key: str) -> float | None:
        vals = [r[key] for r in scored if r[key] is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    tokens, turns = sum(r["tokens"] for r in rows), sum(r["turns"] for r in rows)
    return {
        "tasks_scored": len(scored),
        "attempts_scored": n_attempts,
        "infra_failures": sum(len(r["infra_errors"]) for r in rows),
        "tasks_without_score": [r["task"] for r in rows if not r["scored"]],
        "pass@1": mean("pass@1"),
        f"pass@{k}": mean(f"pass@{k}"),
        "checks_share": mean("checks_share"),
        "tokens": tokens,
        "turns": turns,
        "tokens_per_attempt": round(tokens / n_attempts, 2) if n_attempts else None,
        "turns_per_attempt": round(turns / n_attempts, 2) if n_attempts else None,
        "reward_hack_attempts": sum(r["reward_hack_attempts"] for r in rows),
    }
