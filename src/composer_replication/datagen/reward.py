"""A shaped sandbox reward for GRPO on coding tasks: partial credit a small model can earn.

A binary "tests pass" reward gives a 135M model an all-zero group almost every time, and an all-equal
group has no policy gradient (TRL logs it as ``frac_reward_zero_std``). Each completion is applied in a
fresh sandbox with the task's files and scored ``Σ w_k · part_k`` over three parts in [0, 1]:

- ``format``: the completion is a well-formed action with at least one tool call (every tool line
  parses as ``wire`` action text, and every tool is one the sandbox has);
- ``runs``: the fraction of its tool calls that ran without a tool error;
- ``tests``: the fraction of the task's tests that pass after the calls: pytest's summary
  (``3 passed, 1 failed``; a collection error counts as a failure), else the test command's exit code.

With the default weights (0.1, 0.2, 0.7) a completion that makes every test pass with calls that all
run scores 1.0. ``tests`` comes from the verifier (`datagen.verifier.verify`): the task's checks run in a
fresh sandbox on the task's files plus only the completion's changes to files the task does not protect,
so rewriting tests, a ``conftest.py`` hook, pytest settings, start-up hooks or planted bytecode earn
nothing; a completion that touched a protected path is counted in ``reward_hack_attempts`` and, under the
default ``on_protected="zero"``, its ``tests`` part is 0. An infrastructure failure (the sandbox cannot
start or an exec fails) scores **None**: TRL leaves it out of the group's mean and std and gives it no
advantage, so it is neither a failure of the model nor a free 0.

For the SDPO channel the reward publishes, per completion of its last call, a hint at the first tool
call that failed (``last_hints``): the error is classified by ``ingestion.errors.classify_error`` (a
malformed tool line is ``json_decode``) and turned into text by ``hint_generator.hint_for_error``; the
trainer's teacher is the same model given the prompt plus that hint (``trainer.composer_trainer``).

What is covered: scores come only from commands run in sandboxes (no network), judged by the verifier.
What is not covered: what the verifier does not cover (its module docstring: code written to target the
verifier itself, weak tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from composer_replication.datagen.env import InfraStats, completion_text
from composer_replication.datagen.sandbox import Sandbox, SandboxError, make_sandbox
from composer_replication.datagen.tasks import Task, bundled_tasks
from composer_replication.datagen.tools import TOOL_SCHEMAS, parse_tool_calls, run_tool
from composer_replication.datagen.verifier import OnProtected, Verdict, passed_fraction, verify
from composer_replication.datagen.workspace import put_task_files
from composer_replication.safety.stop import Stop, as_stop

__all__ = ["TOOL_NAMES", "WEIGHTS", "make_shaped_reward", "passed_fraction", "score_completion"]

WEIGHTS: dict[str, float] = {"format": 0.1, "runs": 0.2, "tests": 0.7}
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOL_SCHEMAS)


def _hint(call: dict[str, Any], content: str) -> str | None:
    from composer_replication.hint_generator import hint_for_error
    from composer_replication.ingestion.errors import classify_error, clean_error_message

    kind = "json_decode" if call["name"] == "_invalid" else classify_error(content)
    meta = {
        "tool_name": call["name"],
        "error_message": clean_error_message(content),
        "tool_input": call["input"],
        "available_tools": list(TOOL_NAMES),
    }
    return hint_for_error(kind, meta)


def _score(
    sb: Sandbox,
    task: Task,
    text: str,
    *,
    tool_timeout: float,
    stop: Stop | None,
    sandbox_factory: Callable[[], Sandbox] | None,
    on_protected: OnProtected,
) -> tuple[dict[str, float], str | None, Verdict]:
    stop = as_stop(stop)
    calls = parse_tool_calls(text)
    well_formed = bool(calls) and all(c["name"] in TOOL_NAMES for c in calls)
    ran, hint = 0, None
    for call in calls:
        outcome = run_tool(sb, call["name"], call["input"], timeout=tool_timeout)
        for v in outcome.violations:
            stop.observe(violation=(v, str(call["input"])[:300]))
        if outcome.is_error:
            if hint is None:
                hint = _hint(call, outcome.content) or None
        else:
            ran += 1
    verdict = verify(task, sb, sandbox=sandbox_factory or make_sandbox, on_protected=on_protected)
    if verdict.tests_score is None:
        raise SandboxError(verdict.infra_error or "the verifier could not run the checks")
    parts = {
        "format": 1.0 if well_formed else 0.0,
        "runs": ran / len(calls) if calls else 0.0,
        "tests": verdict.tests_score,
    }
    return parts, hint, verdict


def score_completion(
    sb: Sandbox,
    task: Task,
    text: str,
    *,
    tool_timeout: float = 20.0,
    stop: Stop | None = None,
    sandbox_factory: Callable[[], Sandbox] | None = None,
    on_protected: OnProtected = "zero",
) -> tuple[dict[str, float], str | None]:
    """Apply ``text``'s tool calls in ``sb`` (already holding the task's files) and score them.

    ``tests`` is the verifier's ``tests_score`` (`datagen.verifier.verify`, its fresh sandbox from
    ``sandbox_factory``, default `make_sandbox`). Returns ``({"format", "runs", "tests"}, hint at the
    first failed call or None)``. Raises `SandboxError` on an infrastructure failure.
    """
    parts, hint, _ = _score(
        sb, task, text, tool_timeout=tool_timeout, stop=stop,
        sandbox_factory=sandbox_factory, on_protected=on_protected,
    )  # fmt: skip
    return parts, hint


def make_shaped_reward(
    tasks: Mapping[str, Task] | None = None,
    *,
    sandbox_factory: Callable[[], Sandbox] | None = None,
    stats: InfraStats | None = None,
    weights: Mapping[str, float] | None = None,
    tool_timeout: float = 20.0,
    stop: Stop | None = None,
    on_protected: OnProtected = "zero",
    task_sandboxes: Mapping[str, Callable[[], Sandbox]] | None = None,
) -> Callable[..., list[float | None]]:
    """A ``reward_funcs`` entry scoring each completion with :func:`score_completion` (module docstring).

    The dataset needs a ``task`` column. The function carries ``stats`` (an `InfraStats`, which also
    counts ``reward_hack_attempts``), ``last_hints``, ``last_parts`` and ``last_verdicts`` (per
    completion of its last call; ``ComposerReplicationTrainer`` reads the hints for SDPO, the parts'
    means as ``reward_parts/<part>`` and ``last_hack_attempts`` as ``reward_hack_attempts``),
    ``parts_history`` (the mean of each part per call) and ``reward_hack_attempts`` (completions so
    far that touched a protected path). Sandbox violations go to ``stop`` (a `Stop`:
    ``observe(violation=(kind, detail))``). ``on_protected``: the verifier's policy (``"zero"`` or
    ``"restore"``, `datagen.verifier`). ``task_sandboxes``: per task name, the sandbox factory its
    completions and checks run in (a mined task's prepared environment), else ``sandbox_factory``.
    """
    tasks = dict(tasks) if tasks is not None else bundled_tasks()
    factory = sandbox_factory or make_sandbox
    stats = stats if stats is not None else InfraStats()
    w = dict(WEIGHTS if weights is None else weights)
    if set(w) != set(WEIGHTS) or any(v < 0 for v in w.values()):
        raise ValueError(f"weights must give each of {sorted(WEIGHTS)} a value >= 0; got {w}")

    def shaped_sandbox_reward(completions: list[Any], task: list[str], **_: Any) -> list[float | None]:
        rewards: list[float | None] = []
        hints: list[str | None] = []
        parts_rows: list[dict[str, float] | None] = []
        verdicts: list[Verdict | None] = []
        for completion, name in zip(completions, task, strict=True):
            text = completion_text(completion)
            if name not in tasks:
                raise ValueError(f"dataset row has task={name!r}; known tasks: {sorted(tasks)}")
            t, make = tasks[name], (task_sandboxes or {}).get(name, factory)
            try:
                with make() as sb:
                    put_task_files(sb, t)
                    parts, hint, verdict = _score(
                        sb, t, text, tool_timeout=tool_timeout, stop=stop,
                        sandbox_factory=make, on_protected=on_protected,
                    )  # fmt: skip
            except SandboxError as e:
                rewards.append(stats.record(None, str(e)))
                hints.append(None)
                parts_rows.append(None)
                verdicts.append(None)
                continue
            stats.reward_hack_attempts += verdict.hacked
            rewards.append(stats.record(sum(w[k] * parts[k] for k in w)))
            hints.append(hint)
            parts_rows.append(parts)
            verdicts.append(verdict)
        fn.last_hints, fn.last_parts, fn.last_verdicts = hints, parts_rows, verdicts
        fn.last_hack_attempts = sum(v is not None and v.hacked for v in verdicts)
        fn.reward_hack_attempts += fn.last_hack_attempts
        scored = [p for p in parts_rows if p is not None]
        if scored:
            fn.parts_history.append({k: sum(p[k] for p in scored) / len(scored) for k in WEIGHTS})
        return rewards

    fn: Any = shaped_sandbox_reward
    fn.stats, fn.last_hints, fn.last_parts, fn.parts_history = stats, [], [], []
    fn.last_verdicts, fn.last_hack_attempts, fn.reward_hack_attempts = [], 0, 0
    return fn
