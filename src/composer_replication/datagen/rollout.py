"""Rollouts: a model acts as a tool-calling agent in a sandbox; the run is recorded as a session log.

What is covered: the agent loop (policy -> tool calls -> sandbox -> tool results, up to ``max_turns``),
rendered with :mod:`composer_replication.wire` (the same system message, action lines and tool-result
messages as training, GRPO and evaluation),
reward = the verifier's verdict (`datagen.verifier.verify`: the task's checks in a fresh sandbox on the
task's files plus the agent's changes to unprotected files; 1.0 solved, 0.0 not; a rollout that touched
a protected path is flagged ``reward_hack``), a Claude Code session log per rollout
(so ``ingestion.claude_code.ClaudeCodeIngester`` turns generated data into states and traces like real
sessions), an append-only ``rollouts.jsonl`` index that makes `run_rollouts` resumable, kill-switch
polling between turns, sandbox violations reported to the switch, and one process per output directory (`_lock`).
``harness`` picks the tool surface and log format (`datagen.harness`: ``claude_code`` or ``codex``; a Codex
rollout log for ``codex``), and ``max_turns`` / ``max_tokens`` / ``max_wall_s`` end a rollout with
``end_reason`` recorded.

What is not covered: infrastructure failures (the sandbox cannot start or crashes, the harness times
out) are **not** the agent's fault: such rollouts get ``status="infra_error"`` and ``reward=None`` and
must be excluded from training (`trainable` filters them), never scored 0.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from composer_replication import wire
from composer_replication._io import JsonlAppender, read_jsonl
from composer_replication._lock import directory_lock
from composer_replication.datagen.apply_patch import add_files_patch
from composer_replication.datagen.claude_log import SessionLog
from composer_replication.datagen.codex_log import CodexRolloutLog
from composer_replication.datagen.harness import (
    Budget,
    Toolset,
    check_harness,
    harness_schemas,
    log_format,
    make_toolset,
    output_tokens,
)
from composer_replication.datagen.sandbox import Sandbox, SandboxError, make_sandbox
from composer_replication.datagen.tasks import Task, check_name, path_inside
from composer_replication.datagen.tools import TOOL_SCHEMAS, format_tool_call, parse_tool_calls
from composer_replication.datagen.verifier import OnProtected, Verdict, verify
from composer_replication.datagen.workspace import put_task_files
from composer_replication.safety.kill_switch import EXIT_KILL_SWITCH, KillSwitchTriggered
from composer_replication.safety.stop import Stop, as_stop

Policy = Callable[[list[dict[str, Any]]], str]  # chat messages -> assistant text (tool calls inline)


def task_prompt(task: Task, harness: str | None = None) -> list[dict[str, Any]]:
    """The opening messages of ``task`` (``wire.task_messages`` with the harness's tools; the task's
    ``example_call`` after its instruction, in the active wire format): what a rollout starts from and
    what the GRPO phase's task rows ask, token for token."""
    instruction = task.instruction
    if task.example_call:
        instruction += "\n" + wire.example_call(task.example_call["name"], task.example_call["arguments"])
    return wire.task_messages(instruction, task.files, harness_schemas(harness))


# --------------------------------------------------------------------------- policies
class ScriptedPolicy:
    """Replays fixed assistant texts, then ends the episode (for tests and demos)."""

    def __init__(self, steps: Sequence[str], model: str = "scripted") -> None:
        self.steps, self.model, self._i = list(steps), model, 0

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        self._i += 1
        return self.steps[self._i - 1] if self._i <= len(self.steps) else "Done."


def oracle_policy(task: Task, harness: str | None = None) -> ScriptedPolicy:
    """Writes the task's bundled solution and runs the tests: a policy that should score 1 (in
    ``claude_code`` it reads a file before overwriting it; in ``codex`` it applies one patch)."""
    if check_harness(harness) == "codex":
        test = {"command": ["bash", "-lc", task.test_command]}
        steps = [format_tool_call("apply_patch", {"input": add_files_patch(task.solution)})]
        return ScriptedPolicy([*steps, format_tool_call("shell", test), "Done."], "oracle")
    reads = [p for p in task.solution if p in task.files] if harness == "claude_code" else []
    steps = [format_tool_call("Read", {"file_path": p}) for p in reads]
    steps += [format_tool_call("Write", {"file_path": p, "content": c}) for p, c in task.solution.items()]
    return ScriptedPolicy(
        [*steps, format_tool_call("Bash", {"command": task.test_command}), "Done."], "oracle"
    )


class HFPolicy:
    """A transformers causal LM behind its chat template; tool calls are parsed from its text (``wire``).

    Prompts are rendered by ``wire.render_ids`` with the sandbox tools' schemas (``tools``, default
    ``TOOL_SCHEMAS``), in the active wire format: the prompt the model was trained on. The answer comes
    from the one generation engine (``generation.LocalEngine``): the tokens ``model.generate`` gives with
    the same settings and RNG state."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.7,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        from composer_replication.generation.local import LocalEngine

        self.model, self.tokenizer = model, tokenizer
        self.tools = list(TOOL_SCHEMAS if tools is None else tools)
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.model_name = getattr(getattr(model, "config", None), "_name_or_path", None) or "hf-model"
        self.engine = LocalEngine(
            model, tokenizer, render=lambda m: wire.render_ids(tokenizer, m, self.tools)
        )

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        from composer_replication.generation.local import generate_params

        params = generate_params(self.model, max_new_tokens=self.max_new_tokens, temperature=self.temperature)
        return self.engine.complete([messages], params)[0].text


class EndpointPolicy:
    """A model behind an OpenAI-compatible endpoint (``transformers serve``, vLLM, a provider) as a
    rollout policy: ``engine`` is a ``teacher_replay.endpoint.OpenAIEndpoint``. The server's own tool
    calls, if it returns any, are written into the answer as ``wire`` writes calls (``action_text``),
    so they parse as the same calls an in-process answer with that text would."""

    def __init__(self, engine: Any, *, max_new_tokens: int = 256, temperature: float = 0.7) -> None:
        self.engine, self.model_name = engine, engine.model
        self.max_new_tokens, self.temperature = max_new_tokens, temperature

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        from composer_replication.generation.types import GenerationParams, action_text

        params = GenerationParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature)
        return action_text(self.engine.complete([messages], params)[0])


# --------------------------------------------------------------------------- rollouts
@dataclass
class RolloutResult:
    rollout_id: str
    task: str
    status: str  # "ok" | "infra_error"
    reward: float | None  # 1.0 solved (the verifier), 0.0 not, None on infra_error
    turns: int = 0
    session_log: str | None = None
    test_output: str = ""
    error: str | None = None
    violations: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    protected_touched: list[str] = field(default_factory=list)  # protected paths the agent touched
    reward_hack: bool = False  # it touched one: a reward-hack attempt (scored 0 under on_protected="zero")
    harness: str | None = None  # datagen.harness: None (four sandbox tools), "claude_code", "codex"
    end_reason: str = ""  # harness.END_REASONS: "done", "max_turns", "max_tokens", "max_wall_s"
    tokens: int = 0  # tokens the policy generated (its own count when it reports one, else estimated)
    checks: list[bool] = field(default_factory=list)  # per check of the verdict: did it pass


def score_in_sandbox(
    sb: Sandbox,
    task: Task,
    *,
    sandbox_factory: Callable[[], Sandbox] | None = None,
    on_protected: OnProtected = "zero",
) -> tuple[float, str]:
    """The verifier's verdict on the work in ``sb`` (`datagen.verifier.verify`, its fresh sandbox from
    ``sandbox_factory``): (1.0 if solved else 0.0, the checks' output). Raises `SandboxError`."""
    verdict = verify(task, sb, sandbox=sandbox_factory or make_sandbox, on_protected=on_protected)
    if verdict.infra_error is not None:
        raise SandboxError(verdict.infra_error)
    return (1.0 if verdict.solved else 0.0), verdict.output


def _record_verdict(result: RolloutResult, verdict: Verdict) -> None:
    if verdict.infra_error is not None:
        raise SandboxError(verdict.infra_error)
    result.reward, result.test_output = (1.0 if verdict.solved else 0.0), verdict.output
    result.protected_touched, result.reward_hack = verdict.protected_touched, verdict.hacked
    result.checks = [c.passed for c in verdict.checks]


def _split_blocks(text: str, calls: list[dict[str, Any]], id_prefix: str = "toolu_") -> list[dict[str, Any]]:
    prose = wire.parse_action(text).text
    blocks: list[dict[str, Any]] = [{"type": "text", "text": prose}] if prose or not calls else []
    for c in calls:
        tool_id = f"{id_prefix}{uuid.uuid4().hex[:24]}"
        blocks.append({"type": "tool_use", "id": tool_id, "name": c["name"], "input": c["input"]})
    return blocks


def _call_tool(
    toolset: Toolset,
    block: dict[str, Any],
    timeout: float,
    result: RolloutResult,
    stop: Stop,
    log: SessionLog | CodexRolloutLog | None,
) -> dict[str, Any]:
    """Run one ``tool_use`` block in the sandbox: its sandbox violations go to ``result`` and ``stop``,
    its result to the log; returns the tool turn the policy sees next."""
    outcome = toolset.call(block["name"], block["input"], timeout=timeout)
    for v in outcome.violations:
        result.violations.append(v)
        stop.observe(violation=(v, json.dumps(block["input"])[:300]))
    if log:
        log.tool_result(block["id"], outcome.content, outcome.is_error, outcome.tool_use_result)
    err = outcome.content if outcome.is_error else None
    return {"role": "tool", "name": block["name"], "content": outcome.content, "tool_error": err}


def run_rollout(
    task: Task,
    policy: Policy,
    *,
    rollout_id: str | None = None,
    log_dir: str | Path | None = None,
    sandbox_factory: Callable[[], Sandbox] | None = None,
    max_turns: int = 8,
    tool_timeout: float = 30.0,
    stop: Stop | Callable[[], str | None] | None = None,
    on_protected: OnProtected = "zero",
    harness: str | None = None,
    max_tokens: int | None = None,
    max_wall_s: float | None = None,
) -> RolloutResult:
    """One episode of ``task`` under ``policy`` in ``harness`` (`datagen.harness`), until the policy
    answers without a tool call or a limit (``max_turns``, ``max_tokens`` generated, ``max_wall_s``)
    ends it; scored by the verifier (``on_protected``: its policy). Raises `KillSwitchTriggered` when
    ``stop`` fires (a `safety.Stop` such as a `KillSwitch`: fed each sandbox violation)."""
    rollout_id = check_name(rollout_id or f"{task.name}-{uuid.uuid4().hex[:8]}", "rollout id")
    stop = as_stop(stop)
    model = getattr(policy, "model_name", None) or getattr(policy, "model", "policy")
    budget = Budget(max_turns, max_tokens, max_wall_s)
    codex = log_format(harness) == "codex"
    log: SessionLog | CodexRolloutLog | None = None
    if log_dir is not None:
        log = (CodexRolloutLog if codex else SessionLog)(path_inside(log_dir, rollout_id, ".jsonl"))
    opening = task_prompt(task, harness)
    system, turns = opening[0]["content"], [{"role": "user", "content": opening[1]["content"]}]
    result = RolloutResult(rollout_id, task.name, "ok", None, session_log=str(log.path) if log else None)
    result.harness = harness
    t0 = time.monotonic()
    if log:
        log.user(turns[0]["content"])  # what the model saw, so the ingested log renders the same prompt
    try:
        factory = sandbox_factory or make_sandbox
        with factory() as sb:
            put_task_files(sb, task)
            toolset, budget.t0 = make_toolset(harness, sb), time.monotonic()
            while (end := budget.stop_reason()) is None:
                if (reason := stop()) is not None:
                    raise KillSwitchTriggered(reason)
                text = policy(wire.turns_to_messages(turns, system)[0])
                calls = parse_tool_calls(text)
                blocks = _split_blocks(text, calls, "call_" if codex else "toolu_")
                budget.spend(n_out := output_tokens(policy, text))
                result.turns, result.tokens = budget.turns, budget.tokens
                if log:
                    log.assistant(blocks, str(model), {"output_tokens": n_out})
                turns.append({"role": "assistant", "content": text})
                if not calls:
                    end = "done"
                    break
                for block in (b for b in blocks if b["type"] == "tool_use"):
                    timeout = budget.tool_timeout(tool_timeout)
                    turns.append(_call_tool(toolset, block, timeout, result, stop, log))
            result.end_reason = end
            if log:
                log.end(end)
            _record_verdict(result, verify(task, sb, sandbox=factory, stop=stop, on_protected=on_protected))
    except SandboxError as e:
        result.status, result.reward, result.error = "infra_error", None, f"{type(e).__name__}: {e}"
    finally:
        if log:
            log.close()
    result.duration_s = time.monotonic() - t0
    return result


def trainable(results: Sequence[RolloutResult | dict[str, Any]]) -> list[Any]:
    """Drop infrastructure failures: they say nothing about the policy."""
    return [
        r for r in results if (r.status if isinstance(r, RolloutResult) else r["status"]) != "infra_error"
    ]


def run_rollouts(
    tasks: Sequence[Task],
    policy_for: Callable[[Task], Policy],
    out_dir: str | Path,
    *,
    samples_per_task: int = 1,
    progress: bool = True,
    **rollout_kwargs: Any,
) -> list[RolloutResult]:
    """Rollouts for every task x sample into ``out_dir`` (``sessions/*.jsonl`` + ``rollouts.jsonl``); resumable.

    A rollout already in ``rollouts.jsonl`` with ``status="ok"`` is skipped; infra errors are retried.
    One process per ``out_dir``: a second one raises `_lock.DirectoryInUse` naming the holder.
    """
    from tqdm.auto import tqdm

    out = Path(out_dir)
    with directory_lock(out, "rollout output directory"):
        index = out / "rollouts.jsonl"
        done = {r["rollout_id"] for r in read_jsonl(index)} if index.exists() else set()
        done_ok = {r["rollout_id"] for r in read_jsonl(index) if r["status"] == "ok"} if done else set()
        jobs = [(t, i) for t in tasks for i in range(samples_per_task) if f"{t.name}-{i:03d}" not in done_ok]
        results = []
        with JsonlAppender(index) as appender:
            for task, i in tqdm(jobs, desc="rollouts", disable=not progress):
                r = run_rollout(
                    task,
                    policy_for(task),
                    rollout_id=f"{task.name}-{i:03d}",
                    log_dir=out / "sessions",
                    **rollout_kwargs,
                )
                appender.write(asdict(r))
                results.append(r)
        return results


__all__ = [
    "EXIT_KILL_SWITCH",
    "EndpointPolicy",
    "HFPolicy",
    "RolloutResult",
    "ScriptedPolicy",
    "SessionLog",
    "oracle_policy",
    "run_rollout",
    "run_rollouts",
    "score_in_sandbox",
    "task_prompt",
    "trainable",
]
