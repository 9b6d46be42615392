"""Score a policy on a task set: `eval TASKS --policy reference|noop --out DIR`.

TASKS is a directory of task folders (`tasks mine --out TASKS`, or the task.json layout). For each task the
policy acts in a sandbox holding the task's starting files, then the project's verifier runs the task's
checks on a fresh copy of the task's files plus the policy's changes to non-protected files. DIR/eval.json
holds per policy pass@1 (and pass@K with --samples K), the share of checks passing, turns and tokens, and
one row per task; infrastructure failures are counted apart, never scored. `--policy reference` must
solve every validated task; `--policy noop` must solve none whose checks include a FAIL_TO_PASS one.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", type=Path, metavar="TASKS", help="a directory of task folders")
    parser.add_argument(
        "--policy", action="append", choices=["reference", "noop"], required=True,
        help="a built-in policy to score (repeatable)",
    )  # fmt: skip
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="where eval.json is written")
    parser.add_argument("--samples", type=int, default=1, metavar="K", help="attempts per task (pass@K)")
    parser.add_argument(
        "--sandbox", choices=["bwrap", "docker"], help="sandbox backend (default: what is there)"
    )


def run(args: argparse.Namespace) -> int:
    from composer_replication.tasks.evaluate import NoopPolicy, Policy, ReferencePolicy, evaluate

    if args.samples < 1:
        raise ValueError(f"--samples {args.samples}: must be at least 1")
    made: dict[str, Policy] = {"reference": ReferencePolicy(), "noop": NoopPolicy()}
    policies = [made[p] for p in dict.fromkeys(args.policy)]
    result = evaluate(args.tasks, policies, args.out, samples=args.samples, sandbox=args.sandbox)
    for p in result["policies"]:
        print(
            f"{p['name']}: pass@1 {p['pass@1']}, checks passing {p['checks_share']}, "
            f"{p['tasks_scored']} tasks scored, {p['infra_failures']} infrastructure failures"
        )
    print(f"wrote {args.out / 'eval.json'}")
    return 0
