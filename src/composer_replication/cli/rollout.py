"""Run a model as a coding agent on sandboxed tasks and record the runs as Claude Code sessions."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from composer_replication.cli._agent import add_agent_arguments

if TYPE_CHECKING:
    from composer_replication.datagen.rollout import Policy
    from composer_replication.datagen.tasks import Task


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory (sessions/ and rollouts.jsonl)")
    p.add_argument("--tasks", nargs="*", help="bundled task names (default: all)")
    p.add_argument(
        "--policy", default="oracle",
        help="'oracle', a path to a HF model directory, or an OpenAI-compatible endpoint's base URL (http(s)://.../v1)",
    )  # fmt: skip
    p.add_argument("--stop-file", default=None, help="stop (exit 3) when this file exists")
    add_agent_arguments(p, per="rollout", harness_help="tools and log format")


def _policy_for(args: argparse.Namespace) -> Callable[[Task], Policy]:
    """The rollout policy per task: the task's oracle, an endpoint's model, or a local model."""
    from composer_replication.datagen import rollout

    if args.policy == "oracle":
        return lambda task: rollout.oracle_policy(task, args.harness)
    if args.policy.startswith(("http://", "https://")):
        from composer_replication.teacher_replay.endpoint import OpenAIEndpoint
        from composer_replication.teacher_replay.keys import resolve_api_key

        key = resolve_api_key(None, "OPENAI_API_KEY")
        endpoint = rollout.EndpointPolicy(OpenAIEndpoint(args.policy, args.endpoint_model, api_key=key))
        return lambda task: endpoint
    from composer_replication.models import load_model_and_tokenizer

    hf = rollout.HFPolicy(*load_model_and_tokenizer(args.policy))
    return lambda task: hf


def run(args: argparse.Namespace) -> int:
    """Run the rollouts; when the kill switch fires, one line ``stopped: REASON`` and its exit code (3)."""
    from composer_replication.datagen.rollout import run_rollouts
    from composer_replication.datagen.sandbox import make_sandbox
    from composer_replication.datagen.tasks import bundled_tasks
    from composer_replication.safety.kill_switch import KillSwitch, KillSwitchTriggered

    available = bundled_tasks()
    unknown = set(args.tasks or []) - set(available)
    if unknown:
        raise ValueError(f"unknown task(s) {sorted(unknown)}; bundled: {sorted(available)}")
    tasks = [available[n] for n in (args.tasks or sorted(available))]
    policy_for = _policy_for(args)
    out = Path(args.out)
    with KillSwitch(stop_file=args.stop_file, log_path=out / "kill_switch.jsonl") as switch:
        try:
            results = run_rollouts(
                tasks, policy_for, out, stop=switch, max_turns=args.max_turns, harness=args.harness,
                max_tokens=args.max_tokens, max_wall_s=args.max_wall_s,
                sandbox_factory=lambda: make_sandbox(args.sandbox),
            )  # fmt: skip
        except KillSwitchTriggered as e:
            print(f"stopped: {e.reason}", file=sys.stderr)
            return e.exit_code
    for r in results:
        line = {"rollout_id": r.rollout_id, "status": r.status, "reward": r.reward, "end": r.end_reason}
        print(json.dumps(line | {"reward_hack": r.reward_hack}))
    hacks = sum(r.reward_hack for r in results)
    print(f"{len(results)} rollouts, reward_hack_attempts={hacks}", file=sys.stderr)
    return 0
