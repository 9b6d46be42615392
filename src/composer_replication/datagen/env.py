"""TRL GRPO over sandboxed coding tasks: an ``environment_factory`` environment and a test-running reward.

What is covered:
- `SandboxCodingEnv`: one instance per rollout (TRL pools and ``reset()``s them); ``reset(task=...)`` starts
  a fresh sandbox with the task's files; its public methods ``bash``, ``read``, ``write``, ``edit`` are the
  model's tools (TRL reads their signatures and docstrings); ``get_reward()`` asks the verifier
  (`datagen.verifier.verify`: the task's checks in a fresh sandbox, test files from the task): 1.0
  solved, 0.0 not.
- `make_test_reward`: a plain ``reward_funcs`` entry for tool-less GRPO: it applies the tool calls found
  in each completion (``wire`` action lines) in a fresh sandbox, then asks the verifier.
- Infrastructure failures (sandbox start or exec failing) return **None**: TRL 1.16 turns None into NaN,
  leaves it out of the group mean/std (``nanmean``/``nanstd``) and zeroes that completion's advantage, so
  it neither scores 0 nor moves the policy. Both count them in an `InfraStats`.

`SandboxCodingEnv` hands tool calling to TRL, which parses calls in the tokenizer's chat-template format
(Hermes ``<tool_call>`` for Qwen): use it with a tool-calling template; the pipeline does not (its
online phase uses `make_test_reward` / ``pipeline.grpo_phase`` in the one ``wire`` format).

What is not covered: the sandbox's own limits (see ``bwrap_sandbox`` / ``docker_sandbox``); a task whose
test command is itself broken scores 0, like an agent failure — check tasks with their ``solution/``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from composer_replication.datagen.sandbox import Sandbox, SandboxError, make_sandbox
from composer_replication.datagen.tasks import Task, bundled_tasks
from composer_replication.datagen.tools import parse_tool_calls, run_tool
from composer_replication.datagen.verifier import verify
from composer_replication.datagen.workspace import put_task_files
from composer_replication.safety.stop import Stop, as_stop


@dataclass
class InfraStats:
    """Counts of scored rollouts and of infrastructure failures (excluded from training)."""

    scored: int = 0
    infra_errors: int = 0
    rewards: list[float | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reward_hack_attempts: int = 0  # scored rollouts that touched a protected path (`datagen.verifier`)

    def record(self, reward: float | None, error: str | None = None) -> float | None:
        self.rewards.append(reward)
        if reward is None:
            self.infra_errors += 1
            self.errors.append(error or "unknown")
        else:
            self.scored += 1
        return reward


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """A completion as text: itself, or its messages' contents joined (TRL's conversational rows)."""
    return completion if isinstance(completion, str) else "".join(m.get("content") or "" for m in completion)


def _score(sb: Sandbox, task: Task, factory: Callable[[], Sandbox], stats: InfraStats) -> float | None:
    """1.0 / 0.0 by the verifier (`datagen.verifier.verify`; a fresh sandbox from ``factory``), recorded
    in ``stats``; None (recorded as an infrastructure failure) when the checks could not run."""
    verdict = verify(task, sb, sandbox=factory)
    if verdict.infra_error is not None:
        return stats.record(None, verdict.infra_error)
    stats.reward_hack_attempts += verdict.hacked
    return stats.record(1.0 if verdict.solved else 0.0)


class SandboxCodingEnv:
    """A coding task in a sandbox, for ``GRPOTrainer(environment_factory=...)`` (see module docstring).

    Build it with ``functools.partial`` or a lambda to pass options: ``environment_factory=lambda:
    SandboxCodingEnv(stats=stats)``. Dataset rows carry ``task`` (a bundled or given task name).
    """

    def __init__(
        self,
        tasks: Mapping[str, Task] | None = None,
        *,
        sandbox_factory: Callable[[], Sandbox] | None = None,
        stats: InfraStats | None = None,
        stop: Stop | Callable[[], str | None] | None = None,
        tool_timeout: float = 20.0,
    ) -> None:
        self._tasks = dict(tasks) if tasks is not None else bundled_tasks()
        self._factory = sandbox_factory or make_sandbox
        self._stats = stats if stats is not None else InfraStats()
        self._stop = as_stop(stop)  # fed each sandbox violation
        self._tool_timeout = tool_timeout
        self._sb: Sandbox | None = None
        self._task: Task | None = None
        self._infra_error: str | None = None

    def reset(self, task: str | None = None, **_: Any) -> str | None:
        self._close()
        self._infra_error = None
        if task not in self._tasks:
            raise ValueError(
                f"dataset row has task={task!r}; known tasks: {sorted(self._tasks)} (add a 'task' column)"
            )
        self._task = self._tasks[task]
        try:
            sb = self._factory()
            sb.start()
            self._sb = sb
            put_task_files(sb, self._task)
        except SandboxError as e:
            self._infra_error = str(e)
            return None
        return "Files in the workspace: " + ", ".join(sorted(self._task.files))

    def _tool(self, name: str, **args: Any) -> str:
        if self._sb is None:
            # No sandbox (infra failure at reset): the tool reports it; the rollout is excluded at scoring.
            return "Error: sandbox unavailable"
        try:
            outcome = run_tool(self._sb, name, args, timeout=self._tool_timeout)
        except SandboxError as e:
            self._infra_error = str(e)
            return "Error: sandbox failure"
        for v in outcome.violations:
            self._stop.observe(violation=(v, str(args)[:300]))
        return outcome.content

    def bash(self, command: str) -> str:
        """Run a shell command in the task's workspace and return its output.

        Args:
            command: The bash command to run.
        """
        return self._tool("Bash", command=command)

    def read(self, file_path: str) -> str:
        """Read a file of the workspace.

        Args:
            file_path: Path relative to the workspace.
        """
        return self._tool("Read", file_path=file_path)

    def write(self, file_path: str, content: str) -> str:
        """Create or overwrite a file in the workspace.

        Args:
            file_path: Path relative to the workspace.
            content: The full new content of the file.
        """
        return self._tool("Write", file_path=file_path, content=content)

    def edit(self, file_path: str, old_string: str, new_string: str) -> str:
        """Replace exactly one occurrence of old_string with new_string in a file.

        Args:
            file_path: Path relative to the workspace.
            old_string: The exact text to replace.
            new_string: The replacement text.
        """
        return self._tool("Edit", file_path=file_path, old_string=old_string, new_string=new_string)

    def get_reward(self) -> float | None:
        """1.0 if the task's tests pass in the sandbox, 0.0 if not, None after an infrastructure failure."""
        try:
            if self._infra_error is not None or self._sb is None or self._task is None:
                return self._stats.record(None, self._infra_error or "no sandbox")
            return _score(self._sb, self._task, self._factory, self._stats)
        finally:
            self._close()

    def _close(self) -> None:
        if self._sb is not None:
            self._sb.stop()
            self._sb = None


def make_test_reward(
    tasks: Mapping[str, Task] | None = None,
    *,
    sandbox_factory: Callable[[], Sandbox] | None = None,
    stats: InfraStats | None = None,
    tool_timeout: float = 20.0,
) -> Callable[..., list[float | None]]:
    """A ``reward_funcs`` entry: replay each completion's tool calls in a fresh sandbox, then run the tests.

    The dataset needs a ``task`` column. Returns 1.0 / 0.0 per completion, None on infrastructure failure.
    """
    tasks = dict(tasks) if tasks is not None else bundled_tasks()
    factory = sandbox_factory or make_sandbox
    stats = stats if stats is not None else InfraStats()

    def sandbox_tests_reward(completions: list[Any], task: list[str], **_: Any) -> list[float | None]:
        rewards: list[float | None] = []
        for completion, name in zip(completions, task, strict=True):
            text = completion_text(completion)
            t = tasks[name]
            try:
                with factory() as sb:
                    put_task_files(sb, t)
                    for call in parse_tool_calls(text):
                        run_tool(sb, call["name"], call["input"], timeout=tool_timeout)
                    rewards.append(_score(sb, t, factory, stats))
            except SandboxError as e:
                rewards.append(stats.record(None, str(e)))
        return rewards

    sandbox_tests_reward.stats = stats  # type: ignore[attr-defined]
    return sandbox_tests_reward
