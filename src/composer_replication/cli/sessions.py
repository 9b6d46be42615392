"""List sessions: source, project, start, turns, tool calls, errors, title (a table, or --json).

PATH may be session files or folders (default: ~/.claude/projects and ~/.codex/sessions). The sessions are
parsed into an ingest folder (--store DIR, default a cache under ~/.cache/composer-replication/sessions) so
that listing again only reads what changed; an existing `ingest --out DIR` folder can be passed as --store.
Filters: --since/--until/--project/--session, as for `ingest`; --keep-trivial also lists empty and warmup
sessions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from composer_replication.cli.ingest import add_filter_arguments, filter_kwargs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help="session files or folders")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    parser.add_argument(
        "--store", metavar="DIR", type=Path, help="ingest folder to parse into (reused next time)"
    )
    parser.add_argument("--include-sidechains", action="store_true", help="also list subagent runs")
    parser.add_argument("--keep-trivial", action="store_true", help="also list empty and warmup sessions")
    add_filter_arguments(parser)


def _default_store() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "composer-replication" / "sessions"


def run(args: argparse.Namespace) -> int:
    from composer_replication.ingestion import default_session_roots, list_sessions

    paths = args.paths or default_session_roots()
    if not paths:
        raise FileNotFoundError("no PATH given and neither ~/.claude/projects nor ~/.codex/sessions exists")
    rows = list_sessions(
        paths, args.store or _default_store(), skip_sidechain=not args.include_sidechains,
        keep_trivial=args.keep_trivial, **filter_kwargs(args),
    )  # fmt: skip
    rows.sort(key=lambda r: (r.get("start") or "", r["trace_id"]))
    if args.json:
        for r in rows:
            print(json.dumps(r, ensure_ascii=False))
        return 0
    print_table(rows)
    return 0


def print_table(rows: list[dict[str, Any]], out: Any = None) -> None:
    out = out or sys.stdout
    head = ("source", "project", "start", "turns", "tools", "errors", "title")
    table = [
        (
            r["source"],
            _short(Path(str(r.get("project") or "")).name or str(r.get("project") or ""), 24),
            (r.get("start") or "")[:16].replace("T", " "),
            str(r["n_turns"]),
            str(r["n_tool_calls"]),
            str(r["n_tool_errors"]),
            _short((r.get("title") or "").replace("\n", " "), 60),
        )
        for r in rows
    ]
    widths = [max([len(h), *(len(t[i]) for t in table)]) for i, h in enumerate(head)]
    right = {3, 4, 5}
    for line in [head, *table]:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        print("  ".join(cells).rstrip(), file=out)
    print(f"{len(rows)} sessions", file=out)


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
