"""Send each state to several teacher models under a hard dollar cap.

Reads STATES (an ingest's states.jsonl, or a file of TraceState rows), writes OUT/teacher_calls.jsonl (one row per call,
append-only; a rerun sends only what is missing), OUT/ledger.jsonl (the spend ledger) and
OUT/replay_summary.json. --dry-run prices the run (worst case and expected) without sending anything.

Teachers: --teachers SLUG[=IN:OUT] ... (USD per million tokens; default: the three OpenRouter
defaults), or --config FILE (YAML/JSON: a list of TeacherSpec dicts, or {"teachers": [...]}).
The API key comes from $OPENROUTER_API_KEY (or a teacher's api_key_env) or ./.env; never from a flag,
so it stays out of shell history. OUT is locked while the command runs (a second replay there fails,
naming this one's pid). Exit codes: 3 when --stop-file stopped it; 4 when a provider billed above the
prices the reservations were made with and the ledger ended above --max-usd (spend overrun).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from composer_replication._io import atomic_write_json
from composer_replication.cli._types import non_negative_float, positive_float, positive_int
from composer_replication.config.run import REPLAY_CONCURRENCY, REPLAY_MAX_TOKENS, REPLAY_TIMEOUT_S

if TYPE_CHECKING:
    from composer_replication.teacher_replay.types import TeacherSpec, TraceState


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("states", type=Path, help="states.jsonl (TraceState rows)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--teachers", nargs="+", metavar="SLUG[=IN:OUT]", help="teacher slugs, optionally with prices"
    )
    g.add_argument("--config", type=Path, help="YAML/JSON file with the teacher specs")
    p.add_argument(
        "--base-url", help="send every teacher to this OpenAI-compatible server (vLLM, Ollama, ...)"
    )
    p.add_argument(
        "--max-usd",
        dest="max_total_usd",
        type=non_negative_float,
        required=True,
        help="hard cap on recorded spend, in USD (replay_states' max_total_usd)",
    )
    p.add_argument("--dry-run", action="store_true", help="price the run and exit without sending")
    p.add_argument(
        "--concurrency",
        type=positive_int,
        default=REPLAY_CONCURRENCY,
        help=f"requests in flight at once (default {REPLAY_CONCURRENCY})",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=REPLAY_MAX_TOKENS,
        help="completion cap per call (bounds the worst case)",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=REPLAY_TIMEOUT_S,
        help="seconds per attempt: one deadline for connecting, sending and reading the whole answer",
    )
    p.add_argument("--stop-file", type=Path, help="stop cleanly (exit 3) once this file exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _parse_teacher(arg: str) -> dict[str, Any]:
    from composer_replication.teacher_replay import DEFAULT_TEACHERS

    slug, _, price = arg.partition("=")
    if price:
        try:
            pin, pout = (float(x) for x in price.split(":"))
        except ValueError:
            raise ValueError(
                f"--teachers {arg!r}: prices must be IN:OUT in USD per million tokens, e.g. {slug}=1.25:10"
            ) from None
        if not all(0 <= x < float("inf") for x in (pin, pout)):
            raise ValueError(
                f"--teachers {arg!r}: prices must be finite numbers >= 0 (USD per million tokens)"
            )
        return {"slug": slug, "input_per_mtok": pin, "output_per_mtok": pout}
    for t in DEFAULT_TEACHERS:
        if t["slug"] == slug:
            return dict(t)
    raise ValueError(f"--teachers {slug!r}: unknown price; give it as {slug}=IN:OUT (USD per million tokens)")


def read_teacher_file(path: Path) -> list[dict[str, Any]]:
    """The teacher specs of ``--config``: a list of ``TeacherSpec`` mappings, or ``{teachers: [...]}``,
    in YAML, TOML or JSON (read by the one config reader); ``ConfigError`` naming the file and the field.
    Prices and URLs are checked where every teacher list is (``teacher_replay.plan``)."""
    from composer_replication.config.base import ConfigError, read_config_data
    from composer_replication.teacher_replay.types import TeacherSpec

    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such teacher config")
    data = read_config_data(path)
    shape = "expected a list of teacher specs (mappings with slug, input_per_mtok, output_per_mtok)"
    if isinstance(data, dict):
        for key in sorted(set(data) - {"teachers"}):
            raise ConfigError(
                f"{path}: {key}: unknown key; a teacher file is a list of teacher specs or {{teachers: [...]}}"
            )
        data = data.get("teachers")
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path}: teachers: {shape}, or {{teachers: [...]}}")
    known = TeacherSpec.__required_keys__ | TeacherSpec.__optional_keys__
    for i, spec in enumerate(data):
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: teachers.{i}: {shape}; got {type(spec).__name__}")
        for key in sorted(TeacherSpec.__required_keys__ - set(spec)):
            raise ConfigError(f"{path}: teachers.{i}.{key}: missing ({shape})")
        for key in sorted(set(spec) - known):
            raise ConfigError(
                f"{path}: teachers.{i}.{key}: unknown key; a teacher spec has {', '.join(sorted(known))}"
            )
    return [dict(t) for t in data]


def load_teachers(args: argparse.Namespace) -> list[dict[str, Any]]:
    from composer_replication.teacher_replay import DEFAULT_TEACHERS

    if args.config is not None:
        teachers = read_teacher_file(args.config)
    elif args.teachers:
        teachers = [_parse_teacher(a) for a in args.teachers]
    else:
        teachers = [dict(t) for t in DEFAULT_TEACHERS]
    if args.base_url:
        from composer_replication.config.base import check_base_url

        check_base_url(args.base_url, "--base-url")
        for t in teachers:
            t["base_url"] = args.base_url
    return teachers


def run(args: argparse.Namespace) -> int:
    from composer_replication._lock import directory_lock

    if args.out.exists() and not args.out.is_dir():
        raise NotADirectoryError(f"--out {args.out}: is a file; pass a directory for the replay outputs")
    if args.dry_run:
        return _run(args)
    with directory_lock(args.out, "replay output directory"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from composer_replication.ingestion.store import read_states
    from composer_replication.teacher_replay.client import price_run, replay_states

    states = cast("list[TraceState]", list(read_states(args.states)))
    teachers = cast("list[TeacherSpec]", load_teachers(args))
    cache = args.out / "teacher_calls.jsonl"
    ledger = args.out / "ledger.jsonl"
    price = price_run(states, teachers, max_tokens=args.max_tokens, cache_path=cache)
    print(
        f"{len(states)} states x {len(teachers)} teachers = {price['calls_total']} calls "
        f"({price['calls_cached']} cached, {price['calls_to_send']} to send); "
        f"expected ${price['expected_usd']:.4f}, worst case ${price['worst_case_usd']:.4f}, cap ${args.max_total_usd:.4f}",
        file=sys.stderr,
    )
    if args.dry_run:
        print(json.dumps(price, indent=2))
        return 0
    stop = None
    if args.stop_file is not None:
        stop_file = args.stop_file

        def stop() -> str | None:
            return f"stop file {stop_file} exists" if os.path.exists(stop_file) else None

    rep = asyncio.run(
        replay_states(
            states, teachers, max_total_usd=args.max_total_usd, cache_path=cache, ledger_path=ledger,
            concurrency=args.concurrency, max_tokens=args.max_tokens, timeout_s=args.timeout, stop=stop,
            progress=not args.no_progress,
        )
    )  # fmt: skip
    summary = {
        "calls": len(rep.results), "cached": rep.n_cached, "sent": rep.n_sent, "errors": rep.n_errors,
        "errors_by_kind": rep.errors_by_kind, "spent_usd_this_run": rep.spent_usd,
        "spent_usd_total": rep.total_usd, "max_total_usd": args.max_total_usd, "overrun": rep.overrun,
        "tool_modes": rep.tool_modes, "malformed_by_teacher": rep.malformed_by_teacher,
    }  # fmt: skip
    atomic_write_json(args.out / "replay_summary.json", summary)
    print(json.dumps(summary, indent=2))
    if rep.overrun:
        from composer_replication.teacher_replay.ledger import SpendOverrun

        raise SpendOverrun(
            f"spend overrun: {ledger} books ${rep.total_usd:.6f} against the ${args.max_total_usd:.6f} cap; a provider "
            "billed above the prices the reservations were made with (entries marked overrun). Check the teacher prices"
        )
    return 0
