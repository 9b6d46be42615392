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
run scores 1.0. The task's test files (``test_*.py``, ``*_test.py``) are restored before the tests
run, so a completion cannot pass by rewriting them. An infrastructure failure (the sandbox cannot
start or an exec fails) scores **None**: TRL leaves it out of the group's mean and std and gives it no
advantage, so it is neither a failure of the model nor a free 0.

For the SDPO channel the reward publishes, per completion of its last call, a hint at the first tool
call that failed (``last_hints``): the error is classified by ``ingestion.errors.classify_error`` (a
malformed tool line is ``json_decode``) and turned into text by ``hint_generator.hint_for_error``; the
trainer's teacher is the same model given the prompt plus that hint (``trainer.composer_trainer``).

What is covered: scores come only from commands run in the sandbox (no network). What is not covered: a
completion can still game tests by other means than editing test files (a ``conftest.py`` that patches
them, say); the bundled tasks are small enough to read, real tasks need tests the agent cannot reach.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from composer_replication.datagen.env import InfraStats
from composer_replication.datagen.sandbox import Sandbox, SandboxError, make_sandbox
from composer_replication.datagen.tasks import Task, bundled_tasks
from composer_replication.datagen.tools import TOOL_SCHEMAS, parse_tool_calls, run_tool
from composer_replication.safety.stop import Stop, as_stop

WEIGHTS: dict[str, float] = {"format": 0.1, "runs": 0.2, "tests": 0.7}
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOL_SCHEMAS)
_COUNT = re.compile(r"(\d+) (passed|failed|errors?)\b")


def passed_fraction(output: str, ok: bool) -> float:
    """Passed / (passed + failed + errors) from the last pytest-style summary line; else 1.0 / 0.0 by
    the exit status. ``N passed, M failed`` from another test script is read the same way."""
    for line in reversed(output.strip().splitlines()):
        counts = {kind.rstrip("s"): int(n) for n, kind in _COUNT.findall(line)}
        if counts:
            passed = counts.get("passed", 0)
            total = passed + counts.get("failed", 0) + counts.get("error", 0)
            return passed / total if total else float(ok)
    return 1.0 if ok else 0.0


def _is_test_file(path: str) -> bool:
    name = PurePosixPath(path).name
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


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


def score_completion(
    sb: Sandbox, task: Task, text: str, *, tool_timeout: float = 20.0, kill_switch: Stop | None = None
) -> tuple[dict[str, float], str | None]:
    """Apply ``text``'s tool calls in ``sb`` (already holding the task's files) and score them.

    Returns ``({"format", "runs", "tests"}, hint at the first failed call or None)``. Raises
    `SandboxError` on an infrastructure failure.
    """
    stop = as_stop(kill_switch)
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
    for path, content in task.files.items():
        if _is_test_file(path):
            sb.put(path, content)
    r = sb.exec(task.test_command, timeout=task.timeout_s)
    parts = {
        "format": 1.0 if well_formed else 0.0,
        "runs": ran / len(calls) if calls else 0.0,
        "tests": passed_fraction(r.output, r.ok),
    }
    return parts, hint


def make_shaped_reward(
    tasks: Mapping[str, Task] | None = None,
    *,
    sandbox_factory: Callable[[], Sandbox] | None = None,
    stats: InfraStats | None = None,
    weights: Mapping[str, float] | None = None,
    tool_timeout: float = 20.0,
    kill_switch: Stop | None = None,
) -> Callable[..., list[float | None]]:
    """A ``reward_funcs`` entry scoring each completion with :func:`score_completion` (module docstring).

    The dataset needs a ``task`` column. The function carries ``stats`` (an `InfraStats`),
    ``last_hints`` and ``last_parts`` (per completion of its last call; ``ComposerReplicationTrainer``
    reads both: the hints for SDPO, the parts' means as ``reward_parts/<part>`` metrics) and
    ``parts_history`` (the mean of each part per call). Sandbox violations go to ``kill_switch`` (a
    `Stop`: ``observe(violation=(kind, detail))``).
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
        for completion, name in zip(completions, task, strict=True):
            text = (
                completion
                if isinstance(completion, str)
                else "".join(m.get("content") or "" for m in completion)
            )
            if name not in tasks:
                raise ValueError(f"dataset row has task={name!r}; known tasks: {sorted(tasks)}")
            t = tasks[name]
            try:
                with factory() as sb:
                    for path, content in t.files.items():
                        sb.put(path, content)
                    parts, hint = score_completion(
                        sb, t, text, tool_timeout=tool_timeout, kill_switch=kill_switch
                    )
            except SandboxError as e:
                rewards.append(stats.record(None, str(e)))
                hints.append(None)
                parts_rows.append(None)
                continue
            rewards.append(stats.record(sum(w[k] * parts[k] for k in w)))
            hints.append(hint)
            parts_rows.append(parts)
        fn.last_hints, fn.last_parts = hints, parts_rows
        scored = [p for p in parts_rows if p is not None]
        if scored:
            fn.parts_history.append({k: sum(p[k] for p in scored) / len(scored) for k in WEIGHTS})
        return rewards

    fn: Any = shaped_sandbox_reward
    fn.stats, fn.last_hints, fn.last_parts, fn.parts_history = stats, [], [], []
    return fn
