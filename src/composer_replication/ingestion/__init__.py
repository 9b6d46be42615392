"""Trace-source adapters: Claude Code and Codex CLI sessions -> an ingest output folder.

``ingest_paths`` is the library entry point the pipeline and the ``ingest`` CLI call: it finds session files,
detects each file's format, parses them (incrementally: unchanged files are skipped, appended ones resume),
deduplicates records repeated by resumed sessions (within a project folder), redacts secrets (on by default)
and writes each session once plus references to it (``states.jsonl``, ``traces.jsonl``), ``sessions.jsonl``
and ``ingest_stats.json``. Everything downstream reads those through :mod:`composer_replication.ingestion.store`
(``read_states``, ``read_examples``, ``read_sessions``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from composer_replication.ingestion import _select
from composer_replication.ingestion._files import read_session_bytes, scan_session_files
from composer_replication.ingestion._ingest import ingest_paths
from composer_replication.ingestion._session import IngestionStats
from composer_replication.ingestion.claude_code import SYSTEM_PROMPT, ClaudeCodeIngester, is_subagent_path
from composer_replication.ingestion.codex import CodexIngester
from composer_replication.ingestion.redact import Redactor
from composer_replication.ingestion.store import (
    Store,
    StoreFormatError,
    read_examples,
    read_refs,
    read_rows,
    read_sessions,
    read_states,
    write_refs,
)

__all__ = [
    "SYSTEM_PROMPT",
    "ClaudeCodeIngester",
    "CodexIngester",
    "IngestionStats",
    "Redactor",
    "Store",
    "StoreFormatError",
    "default_session_roots",
    "detect_format",
    "find_session_files",
    "ingest_paths",
    "list_sessions",
    "read_examples",
    "read_refs",
    "read_rows",
    "read_sessions",
    "read_states",
    "scan_session_files",
    "write_refs",
]


def detect_format(path: Path) -> str:
    """``"codex"`` or ``"claude_code"``, from the first lines of the file (then its name)."""
    return _select.detect_format(Path(path), read_session_bytes(Path(path), 65536))


def default_session_roots() -> list[Path]:
    """``~/.claude/projects`` (or each root of ``CLAUDE_CONFIG_DIR``) and ``$CODEX_HOME/sessions``."""
    roots = [Path(p) / "projects" for p in os.environ.get("CLAUDE_CONFIG_DIR", "").split(",") if p]
    roots = roots or [Path.home() / ".claude" / "projects"]
    codex = Path(os.environ.get("CODEX_HOME", Path.home() / ".codex"))
    roots += [codex / "sessions", codex / "archived_sessions"]
    return [r for r in roots if r.exists()]


def find_session_files(paths: Iterable[str | Path], *, skip_sidechain: bool = True) -> list[Path]:
    """Expand files and folders to ``*.jsonl`` files; a folder is searched recursively.

    Entries that cannot be used (FIFOs, dangling or looping symlinks, unreadable folders) are left out here;
    :func:`scan_session_files` returns them with the reason, and ``ingest_paths`` counts and names them.
    """
    keep = (lambda f, root: not is_subagent_path(f.relative_to(root))) if skip_sidechain else None
    return scan_session_files(paths, keep=keep)[0]


def list_sessions(paths: Iterable[str | Path], out_dir: str | Path, **kw: Any) -> list[dict[str, Any]]:
    """Ingest ``paths`` into ``out_dir`` (incrementally, with the filters of :func:`ingest_paths`) and return one
    row per session: source, project, start, turns, tool calls, errors, title, token usage."""
    ingest_paths(paths, out_dir, **kw)
    return list(read_sessions(out_dir))
