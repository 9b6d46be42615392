"""Coding tasks from your own sessions: `tasks mine SESSIONS --out TASKS`.

Each user request that led to file changes and ran tests becomes a task in the Harbor / Terminal-Bench
layout (instruction.md, task.toml, environment/, tests/, solution/): the repository at the commit the
episode started from, the request as the instruction (secrets redacted), the recorded edits as the
reference solution, and the test commands it ran as checks, kept only when they fail at the start and
pass with the reference in the sandbox (no network). TASKS/report.json lists every session, episode and
drop reason; a re-run reuses validated tasks and mines only what is new. See docs/tasks.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from composer_replication.cli.ingest import add_filter_arguments, filter_kwargs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    mine = sub.add_parser("mine", help="mine validated tasks from sessions and their repositories")
    mine.add_argument("paths", nargs="*", metavar="SESSIONS", help="session files or folders")
    mine.add_argument("--out", required=True, type=Path, metavar="TASKS", help="the tasks directory")
    mine.add_argument(
        "--repo-map", action="append", metavar="OLD=NEW",
        help="a recorded path prefix and where that checkout is now (repeatable)",
    )  # fmt: skip
    mine.add_argument(
        "--check-timeout", type=float, default=120.0, metavar="S", help="seconds per check run (default 120)"
    )
    mine.add_argument(
        "--sandbox", choices=["bwrap", "docker"], help="sandbox backend (default: what is there)"
    )
    mine.add_argument(
        "--env-cache", type=Path, metavar="DIR",
        help="where prepared environments are kept (default ~/.cache/composer-replication/task-envs)",
    )  # fmt: skip
    mine.add_argument(
        "--pip-arg", action="append", default=[], metavar="ARG",
        help="an extra `pip install` option for environments, e.g. --pip-arg=--no-index (repeatable)",
    )  # fmt: skip
    add_filter_arguments(mine)


def run(args: argparse.Namespace) -> int:
    from composer_replication.ingestion import default_session_roots
    from composer_replication.tasks.build import Options
    from composer_replication.tasks.mine import mine_tasks
    from composer_replication.tasks.repo import parse_repo_map

    if args.check_timeout <= 0:
        raise ValueError(f"--check-timeout {args.check_timeout}: must be a positive number of seconds")
    paths = args.paths or default_session_roots()
    if not paths:
        raise FileNotFoundError(
            "no SESSIONS given and neither ~/.claude/projects nor ~/.codex/sessions exists"
        )
    opts = Options(
        repo_map=parse_repo_map(args.repo_map), timeout_s=args.check_timeout, env_cache=args.env_cache,
        pip_args=list(args.pip_arg),
    )  # fmt: skip
    report = mine_tasks(paths, args.out, options=opts, sandbox=args.sandbox, **filter_kwargs(args))
    print(f"{report['counts']['tasks']} tasks in {args.out} (report: {args.out / 'report.json'})")
    return 0
