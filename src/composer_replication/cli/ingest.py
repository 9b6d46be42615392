"""Parse Claude Code / Codex CLI session logs into an ingest folder (secrets redacted).

PATH may be a session .jsonl, a project folder, or a root such as ~/.claude/projects or ~/.codex/sessions;
without PATH the default roots are used. The format is detected per file. Each session is stored once
(parts/); states.jsonl and traces.jsonl reference it, sessions.jsonl lists the sessions. Reruns are
incremental: unchanged files are not read, appended ones resume at their last complete line (--force
starts over). Trivial sessions (no assistant turn, or only a "Warmup") are left out unless --keep-trivial.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from composer_replication.cli._types import MAX_AUTO_JOBS, jobs, non_negative_int, positive_int

# The on/off flags of `ingest` (argparse ``store_true``): flag, what it turns on.
_SWITCHES = (
    ("--no-redact", "DANGEROUS: keep API keys and passwords in the output"),
    ("--yes-i-know", "confirm --no-redact without a prompt"),
    ("--include-sidechains", "also ingest subagent transcripts as their own traces"),
    ("--keep-thinking", "keep [THINKING] blocks in the history given to teachers"),
    ("--keep-trivial", "also keep empty and warmup sessions"),
    ("--force", "re-read every file instead of resuming"),
    ("--no-progress", "no progress bar"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="session files or folders (default: ~/.claude/projects and ~/.codex/sessions)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output folder for states.jsonl, traces.jsonl, ingest_stats.json",
    )
    for flag, what in _SWITCHES:
        parser.add_argument(flag, action="store_true", help=what)
    parser.add_argument(
        "--max-history-tokens",
        type=non_negative_int,
        default=None,
        help="drop the oldest turns of each state's history beyond this many (estimated) tokens",
    )
    parser.add_argument(
        "--example-max-tokens",
        type=positive_int,
        default=8192,
        help="size cap of one traces.jsonl example (estimated tokens)",
    )
    add_filter_arguments(parser)
    parser.add_argument(
        "--jobs",
        type=jobs,
        default="auto",
        metavar="N",
        help=f"worker processes: project folders are parsed in parallel, same output (default: auto, one per "
        f"CPU core, at most {MAX_AUTO_JOBS}; 1: this process only)",
    )


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    """--since/--until/--project/--session (shared with the ``sessions`` command)."""
    parser.add_argument(
        "--since", metavar="DATE", help="sessions that started on/after DATE (YYYY-MM-DD or ISO time)"
    )
    parser.add_argument("--until", metavar="DATE", help="sessions that started before the end of DATE")
    parser.add_argument(
        "--project",
        metavar="GLOB",
        action="append",
        help="working directory or project folder glob (repeatable)",
    )
    parser.add_argument("--session", metavar="ID", action="append", help="session id or prefix (repeatable)")


def filter_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"since": args.since, "until": args.until, "project": args.project, "session": args.session}


def run(args: argparse.Namespace) -> int:
    from composer_replication.ingestion import default_session_roots, ingest_paths

    paths = args.paths or default_session_roots()
    if not paths:
        raise FileNotFoundError("no PATH given and neither ~/.claude/projects nor ~/.codex/sessions exists")
    if args.no_redact:
        print(
            "WARNING: --no-redact writes secrets found in the sessions (API keys, passwords) to disk.",
            file=sys.stderr,
        )
        if not args.yes_i_know:
            if not sys.stdin.isatty():
                raise ValueError("--no-redact needs --yes-i-know when not run interactively")
            if input("Type 'yes' to continue without redaction: ").strip().lower() != "yes":
                print("aborted", file=sys.stderr)
                return 1
    result = ingest_paths(
        paths,
        args.out,
        redact=not args.no_redact,
        skip_sidechain=not args.include_sidechains,
        strip_thinking=not args.keep_thinking,
        max_history_tokens=args.max_history_tokens,
        example_max_tokens=args.example_max_tokens,
        progress=not args.no_progress and sys.stderr.isatty(),
        force=args.force,
        keep_trivial=args.keep_trivial,
        jobs=args.jobs,
        **filter_kwargs(args),
    )
    _fail_if_nothing_read(result)
    _print_table(result)
    return 0


def _fail_if_nothing_read(result: dict[str, Any]) -> None:
    """Every input failed (a FIFO, a device, unreadable files): an error, not an empty success."""
    t = result["totals"]
    if t["n_files"] and t.get("n_file_errors", 0) == t["n_files"]:
        _print_problems(result)
        errors = [f["error"] for f in result.get("files", []) if f.get("error")]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(
            f"no session file could be read: {errors[0]}{more}; nothing was ingested into "
            f"{result['out_dir']} (pass Claude Code / Codex session .jsonl files or folders)"
        )


def _print_table(result: dict[str, Any]) -> None:
    t = result["totals"]
    status: dict[str, int] = {}
    for f in result.get("files", []):
        status[f.get("status", "failed")] = status.get(f.get("status", "failed"), 0) + 1
    rows = [
        ("files", t["n_files"]), ("  new / appended / rewritten", "{} / {} / {}".format(
            status.get("new", 0), status.get("appended", 0), status.get("rewritten", 0))),
        ("  unchanged (not read)", status.get("unchanged", 0)), ("  failed", t.get("n_file_errors", 0)),
        ("  filtered out", t.get("n_sessions_filtered", 0)), ("entries skipped", t.get("n_files_skipped", 0)),
        ("records", t["n_records_total"]), ("bad lines", t["skipped_truncated_lines"]),
        ("malformed records", t["n_malformed_records"]), ("duplicates dropped", t["n_duplicates"]),
        ("sidechain records skipped", t["skipped_subagent"]), ("subagent runs kept", t.get("n_subagent_runs", 0)),
        ("API-error records dropped", t["n_api_errors"]), ("display-only records left out", t.get("n_display_only", 0)),
        ("context kept (meta, skills, attachments)", t.get("n_context", 0)), ("compactions", t["n_compactions"]),
        ("traces", t.get("n_traces", 0)),
        ("trivial sessions left out", t.get("n_traces_trivial", 0)),
        ("assistant turns", t["n_assistant_turns"]), ("states written", t["n_states_emitted"]),
        ("tool calls", t["n_tool_use_blocks"]), ("tool errors", t["n_tool_errors"]),
        ("cancelled parallel calls", t.get("n_cancelled_tool_calls", 0)),
        ("examples written", t["n_examples"]), ("secrets redacted", sum(t["redactions"].values())),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v:>10,}" if isinstance(v, int) else f"  {k:<{width}}  {v:>10}")
    if t["error_kinds"]:
        print("  error kinds: " + ", ".join(f"{k}={v}" for k, v in sorted(t["error_kinds"].items())))
    if t["redactions"]:
        print("  redacted: " + ", ".join(f"{k}={v}" for k, v in sorted(t["redactions"].items())))
    if t.get("attachments_left_out"):
        print(
            "  attachments left out: "
            + ", ".join(f"{k}={v}" for k, v in sorted(t["attachments_left_out"].items()))
        )
    if t.get("schema_mismatches"):  # logged tool inputs the tool schemas disagree with (rendered as logged)
        worst = sorted(t["schema_mismatches"].items(), key=lambda kv: -kv[1])[:3]
        print(
            f"  tool inputs off their schema: {t['n_schema_mismatches']} ("
            + "; ".join(f"{k} x{v}" for k, v in worst)
            + ")"
        )
    for w in t["version_warnings"] or []:
        print(f"  warning: {w}")
    _print_problems(result)
    print(f"wrote {result['out_dir']}/states.jsonl, traces.jsonl, sessions.jsonl, ingest_stats.json")


def _print_problems(result: dict[str, Any], limit: int = 10) -> None:
    """Name every file that failed or was skipped, and the first bad lines of each file that had some."""
    lines = [f"  failed: {f['error']}" for f in result.get("files", []) if f.get("error")]
    lines += [f"  skipped: {s['path']}: {s['reason']}" for s in result.get("skipped", [])]
    for f in result.get("files", []):
        bad = f.get("first_bad_lines")
        if bad:
            where = ", ".join(f"line {b['line']} ({b['reason']})" for b in bad)
            lines.append(f"  bad lines in {f['file']}: {where}")
    for line in lines[:limit]:
        print(line)
    if len(lines) > limit:
        print(f"  ... and {len(lines) - limit} more (see ingest_stats.json)")
