"""Score models and built-in policies on a task set: `eval TASKS --model A [--model B] --policy ... --out DIR`.

TASKS is a directory of task folders (`tasks mine --out TASKS`, or the task.json layout). A model (`default`,
`tiny`, a model directory, a LoRA adapter directory over its base, or an http(s)://.../v1 endpoint) runs
one rollout per task x sample in the task's harness (the session's own: Claude Code or Codex; else
--harness) with limits on turns, tokens and wall time; each rollout is written as a session log under
DIR/rollouts/. The project's verifier runs the task's checks on a fresh copy of the task's files plus the
changes to non-protected files. DIR/eval.json holds per policy pass@1 (and pass@K with --samples K), the
share of checks passing, turns, tokens and reward-hack attempts, one row per task, and with two models
their paired per-task difference with a 95% interval; DIR/report.html shows pass rate against tokens and
a per-task table. Infrastructure failures are counted apart, never scored. `--policy reference` must solve
every validated task; `--policy noop` must solve none whose checks include a FAIL_TO_PASS one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from composer_replication.cli._agent import add_agent_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", type=Path, metavar="TASKS", help="a directory of task folders")
    parser.add_argument(
        "--model", action="append", default=[], metavar="MODEL",
        help="default | tiny | a model or LoRA adapter directory | http(s)://HOST/v1 (repeatable; "
        "with two, their paired difference)",
    )  # fmt: skip
    parser.add_argument(
        "--policy", action="append", default=[], choices=["reference", "noop"],
        help="a built-in policy to score (repeatable)",
    )  # fmt: skip
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="where eval.json is written")
    parser.add_argument("--samples", type=int, default=1, metavar="K", help="attempts per task (pass@K)")
    add_agent_arguments(
        parser, per="attempt",
        harness_help="the tools of tasks whose provenance names no harness (default: the sandbox's four tools)",
    )  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=256, metavar="N", help="tokens per model turn")
    parser.add_argument(
        "--temperature", type=float, metavar="T",
        help="sampling temperature (default 0, greedy, with one sample; 0.7 with --samples above 1)",
    )  # fmt: skip


def _limits(args: argparse.Namespace) -> dict[str, object]:
    for flag, v in (("--samples", args.samples), ("--max-turns", args.max_turns),
                    ("--max-new-tokens", args.max_new_tokens), ("--max-tokens", args.max_tokens),
                    ("--max-wall-s", args.max_wall_s)):  # fmt: skip
        if v is not None and v < 1:
            raise ValueError(f"{flag} {v}: must be at least 1")
    temperature = args.temperature if args.temperature is not None else (0.7 if args.samples > 1 else 0.0)
    if temperature < 0:
        raise ValueError(f"--temperature {temperature}: must be 0 (greedy) or more")
    return {"max_turns": args.max_turns, "max_tokens": args.max_tokens, "max_wall_s": args.max_wall_s,
            "max_new_tokens": args.max_new_tokens, "temperature": temperature,
            "endpoint_model": args.endpoint_model}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from composer_replication.safety.kill_switch import KillSwitch
    from composer_replication.trainer.evaluation.tasks import evaluate_models

    if not args.model and not args.policy:
        raise ValueError("give at least one --model or --policy to score")
    limits = _limits(args)
    with KillSwitch(stop_file=args.out / "STOP") as switch:
        result = evaluate_models(
            args.tasks, args.out, models=args.model, policies=args.policy, samples=args.samples,
            harness=args.harness, limits=limits, sandbox=args.sandbox, stop=switch,
        )  # fmt: skip
    for p in result["policies"]:
        print(
            f"{p['name']}: pass@1 {p['pass@1']}, checks passing {p['checks_share']}, "
            f"{p['tasks_scored']} tasks scored, {p['infra_failures']} infrastructure failures, "
            f"{p['reward_hack_attempts']} reward-hack attempts"
        )
    for c in result["comparisons"]:
        s = c.get("pass@1")
        if s:
            lo, hi = s["delta_ci95"]
            ci = f", 95% interval [{lo:+.3f}, {hi:+.3f}]" if lo is not None else ""
            print(f"{c['b']} - {c['a']}: pass@1 {s['delta']:+.3f}{ci} over {s['n']} tasks")
    print(f"wrote {args.out / 'eval.json'} and {args.out / 'report.html'}")
    return 0
