"""Rollouts: a model acts as a tool-calling agent in a sandbox; the run is recorded as a Claude Code session.

What is covered: the agent loop (policy -> tool calls -> sandbox -> tool results, up to ``max_turns``),
rendered with :mod:`composer_replication.wire` (the same system message, action lines and tool-result
messages as training, GRPO and evaluation),
reward = the task's test command exits 0 in the same sandbox, a Claude Code session log per rollout
(so ``ingestion.claude_code.ClaudeCodeIngester`` turns generated data into states and traces like real
sessions), an append-only ``rollouts.jsonl`` index that makes `run_rollouts` resumable, kill-switch
polling between turns, and sandbox violations reported to the switch.

What is not covered: infrastructure failures (the sandbox cannot start or crashes, the harness times
out) are **not** the agent's fault: such rollouts get ``status="infra_error"`` and ``reward=None`` and
must be excluded from training (`trainable` filters them), never scored 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from composer_replication import wire
from composer_replication._io import JsonlAppender, read_jsonl
from composer_replication.datagen.sandbox import Sandbox, SandboxError, make_sandbox
from composer_replication.datagen.tasks import Task, bundled_tasks, check_name, path_inside
from composer_replication.datagen.tools import TOOL_SCHEMAS, format_tool_call, parse_tool_calls, run_tool
from composer_replication.safety.kill_switch import EXIT_KILL_SWITCH, KillSwitch, KillSwitchTriggered

Policy = Callable[[list[dict[str, Any]]], str]  # chat messages -> assistant text (tool calls inline)


def task_prompt(task: Task) -> list[dict[str, Any]]:
    """The opening messages of ``task`` (``wire.task_messages`` with the sandbox tools): what a rollout
    starts from and what the GRPO phase's task rows ask, token for token."""
    return wire.task_messages(task.instruction, task.files, TOOL_SCHEMAS)


# --------------------------------------------------------------------------- policies
class ScriptedPolicy:
    """Replays fixed assistant texts, then ends the episode (for tests and demos)."""

    def __init__(self, steps: Sequence[str], model: str = "scripted") -> None:
        self.steps, self.model, self._i = list(steps), model, 0

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        self._i += 1
        return self.steps[self._i - 1] if self._i <= len(self.steps) else "Done."


def oracle_policy(task: Task) -> ScriptedPolicy:
    """Writes the task's bundled solution and runs the tests: a policy that should score 1."""
    steps = [format_tool_call("Write", {"file_path": p, "content": c}) for p, c in task.solution.items()]
    return ScriptedPolicy(
        [*steps, format_tool_call("Bash", {"command": task.test_command}), "Done."], "oracle"
    )


class HFPolicy:
    """A transformers causal LM behind its chat template; tool calls are parsed from its text (``wire``).

    The tools are described in the system message (``task_prompt``), not through the template's
    ``tools=`` argument, so the prompt is the one the model was trained on."""

    def __init__(
        self, model: Any, tokenizer: Any, *, max_new_tokens: int = 256, temperature: float = 0.7
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.model_name = getattr(getattr(model, "config", None), "_name_or_path", None) or "hf-model"

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        import torch

        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = self.model.generate(
                **ids,
                max_new_tokens=self.max_new_tokens,
                do_sample=self.temperature > 0,
                temperature=self.temperature or None,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        return self.tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


# --------------------------------------------------------------------------- session log
class SessionLog:
    """Writes a Claude Code session JSONL (one record per content block, chained by ``parentUuid``)."""

    def __init__(self, path: Path, *, cwd: str = "/workspace", session_id: str | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a partial log from an interrupted attempt is redone, not appended to
        self.path, self.cwd = path, cwd
        self.session_id = session_id or str(uuid.uuid4())
        self._out = JsonlAppender(path, fsync=False)
        self._parent: str | None = None

    def _write(self, rtype: str, message: dict[str, Any], **extra: Any) -> str:
        rid = str(uuid.uuid4())
        self._out.write(
            {
                "type": rtype,
                "uuid": rid,
                "parentUuid": self._parent,
                "isSidechain": False,
                "userType": "external",
                "entrypoint": "composer-replication-rollout",
                "sessionId": self.session_id,
                "cwd": self.cwd,
                "version": "composer-replication",
                "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
                "message": message,
                **extra,
            }
        )
        self._parent = rid
        return rid

    def user(self, text: str) -> None:
        self._write("user", {"role": "user", "content": text})

    def assistant(self, blocks: list[dict[str, Any]], model: str) -> None:
        msg_id, n = f"msg_{uuid.uuid4().hex[:24]}", len(blocks)
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        for i, block in enumerate(blocks):
            last = i == n - 1
            message: dict[str, Any] = {
                "id": msg_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [block],
            }
            message |= {"stop_reason": stop if last else None, "stop_sequence": None}
            message["usage"] = {"input_tokens": 0, "output_tokens": 0}
            self._write("assistant", message, requestId=f"req_{msg_id[4:]}")

    def tool_result(self, tool_use_id: str, content: str, is_error: bool, tool_use_result: Any) -> None:
        block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": is_error}
        self._write("user", {"role": "user", "content": [block]}, toolUseResult=tool_use_result)

    def close(self) -> None:
        self._out.close()


# --------------------------------------------------------------------------- rollouts
@dataclass
class RolloutResult:
    rollout_id: str
    task: str
    status: str  # "ok" | "infra_error"
    reward: float | None  # 1.0 tests pass, 0.0 they fail, None on infra_error
    turns: int = 0
    session_log: str | None = None
    test_output: str = ""
    error: str | None = None
    violations: list[str] = field(default_factory=list)
    duration_s: float = 0.0


def score_in_sandbox(sb: Sandbox, task: Task) -> tuple[float, str]:
    """Run the task's tests in ``sb``: (1.0 if they exit 0 else 0.0, their output). Raises `SandboxError`."""
    r = sb.exec(task.test_command, timeout=task.timeout_s)
    return (1.0 if r.ok else 0.0), r.output


def _split_blocks(text: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    prose = wire.parse_action(text).text
    blocks: list[dict[str, Any]] = [{"type": "text", "text": prose}] if prose or not calls else []
    for c in calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{uuid.uuid4().hex[:24]}",
                "name": c["name"],
                "input": c["input"],
            }
        )
    return blocks


def run_rollout(
    task: Task,
    policy: Policy,
    *,
    rollout_id: str | None = None,
    log_dir: str | Path | None = None,
    sandbox_factory: Callable[[], Sandbox] | None = None,
    max_turns: int = 8,
    tool_timeout: float = 30.0,
    kill_switch: KillSwitch | None = None,
    stop: Callable[[], str | None] | None = None,
) -> RolloutResult:
    """One episode of ``task`` under ``policy``. Raises `KillSwitchTriggered` when ``stop``/``kill_switch`` fires."""
    rollout_id = check_name(rollout_id or f"{task.name}-{uuid.uuid4().hex[:8]}", "rollout id")
    stop = stop or kill_switch
    model = getattr(policy, "model_name", None) or getattr(policy, "model", "policy")
    log = SessionLog(path_inside(log_dir, rollout_id, ".jsonl")) if log_dir is not None else None
    opening = task_prompt(task)
    system, turns = opening[0]["content"], [{"role": "user", "content": opening[1]["content"]}]
    result = RolloutResult(rollout_id, task.name, "ok", None, session_log=str(log.path) if log else None)
    t0 = time.monotonic()
    if log:
        log.user(turns[0]["content"])  # what the model saw, so the ingested log renders the same prompt
    try:
        with (sandbox_factory or make_sandbox)() as sb:
            for path, content in task.files.items():
                sb.put(path, content)
            for _ in range(max_turns):
                if stop is not None and (reason := stop()) is not None:
                    raise KillSwitchTriggered(reason)
                text = policy(wire.turns_to_messages(turns, system)[0])
                calls = parse_tool_calls(text)
                blocks = _split_blocks(text, calls)
                result.turns += 1
                if log:
                    log.assistant(blocks, str(model))
                turns.append({"role": "assistant", "content": text})
                if not calls:
                    break
                for block in (b for b in blocks if b["type"] == "tool_use"):
                    outcome = run_tool(sb, block["name"], block["input"], timeout=tool_timeout)
                    for v in outcome.violations:
                        result.violations.append(v)
                        if kill_switch is not None:
                            kill_switch.record_violation(v, json.dumps(block["input"])[:300])
                    if log:
                        log.tool_result(
                            block["id"], outcome.content, outcome.is_error, outcome.tool_use_result
                        )
                    err = outcome.content if outcome.is_error else None
                    turns.append(
                        {"role": "tool", "name": block["name"], "content": outcome.content, "tool_error": err}
                    )
            result.reward, result.test_output = score_in_sandbox(sb, task)
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
    """
    from tqdm.auto import tqdm

    out = Path(out_dir)
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """CLI options (``composer-replication rollout`` and ``python3 -m composer_replication.datagen.rollout``)."""
    p.add_argument("--out", required=True, help="output directory (sessions/ and rollouts.jsonl)")
    p.add_argument("--tasks", nargs="*", help="bundled task names (default: all)")
    p.add_argument("--policy", default="oracle", help="'oracle' or a path to a HF model directory")
    p.add_argument(
        "--sandbox",
        choices=["bwrap", "docker", "podman"],
        default=None,
        help="sandbox backend (default: docker when its daemon answers and the image is built, else bwrap)",
    )
    p.add_argument("--stop-file", default=None, help="stop (exit 3) when this file exists")
    p.add_argument(
        "--max-turns", type=int, default=8, help="agent turns per rollout before it stops (default 8)"
    )


def run(args: argparse.Namespace) -> int:
    """Run the rollouts; raises `KillSwitchTriggered` (exit code 3 in the CLI) when the switch fires."""
    available = bundled_tasks()
    unknown = set(args.tasks or []) - set(available)
    if unknown:
        raise ValueError(f"unknown task(s) {sorted(unknown)}; bundled: {sorted(available)}")
    tasks = [available[n] for n in (args.tasks or sorted(available))]
    if args.policy == "oracle":
        policy_for: Callable[[Task], Policy] = oracle_policy
    else:
        from composer_replication.models import load_model_and_tokenizer

        hf = HFPolicy(*load_model_and_tokenizer(args.policy))
        policy_for = lambda task: hf  # noqa: E731
    out = Path(args.out)
    with KillSwitch(stop_file=args.stop_file, log_path=out / "kill_switch.jsonl") as switch:
        results = run_rollouts(
            tasks,
            policy_for,
            out,
            kill_switch=switch,
            max_turns=args.max_turns,
            sandbox_factory=lambda: make_sandbox(args.sandbox),
        )
    for r in results:
        print(json.dumps({"rollout_id": r.rollout_id, "status": r.status, "reward": r.reward}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m composer_replication.datagen.rollout", description=__doc__.split("\n")[0]
    )
    add_arguments(p)
    try:
        return run(p.parse_args(argv))
    except KillSwitchTriggered as e:
        print(f"stopped: {e.reason}", file=sys.stderr)
        return e.exit_code
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

__all__ = [
    "EXIT_KILL_SWITCH",
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
