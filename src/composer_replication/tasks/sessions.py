"""Session logs for mining, read by the ingestion parsers with the ``sessions``/``ingest`` filters.

The same file discovery (``scan_session_files``: subagent transcripts and unusable entries left out), format
detection and ``--since/--until/--project/--session`` selection as ``ingest``; each file is parsed by the
Claude Code or Codex ingester and assembled into its main conversation. Redaction is off at this stage
because recorded edits must be replayed byte for byte; what a task keeps of the text (the instruction,
the files, the check commands) is redacted when the task is written (`tasks.mine`). Records repeated by
a resumed session (same ``uuid`` in an earlier file of the folder) are dropped, as ``ingest`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_replication.ingestion._base import AssemblyInputs
from composer_replication.ingestion._files import SessionFileError, read_session_bytes, scan_session_files
from composer_replication.ingestion._select import Filters, head_info
from composer_replication.ingestion._session import Conversation, IngestionStats
from composer_replication.ingestion.claude_code import ClaudeCodeIngester, is_subagent_path
from composer_replication.ingestion.codex import CodexIngester


@dataclass
class SessionLog:
    path: Path
    source: str  # "claude_code" | "codex"
    session_id: str
    cwd: str
    branch: str
    conversation: Conversation | None
    error: str = ""  # why the file could not be used ("" when it could)


def read_sessions(
    paths: list[str | Path], *, since: Any = None, until: Any = None, project: Any = None, session: Any = None
) -> tuple[list[SessionLog], list[dict[str, str]]]:
    """The selected sessions under ``paths`` and the entries skipped while listing them (with reasons)."""
    files, skipped = scan_session_files(paths, keep=lambda f, root: not is_subagent_path(f.relative_to(root)))
    filters = Filters.make(since, until, project, session)
    chosen: list[tuple[Path, dict[str, Any]]] = []
    for f in files:
        try:
            info = head_info(f, read_session_bytes(f, 65536))
        except SessionFileError as e:
            skipped.append({"path": str(f), "reason": str(e)})
            continue
        if filters.keep(f, info):
            chosen.append((f, info))
    chosen.sort(key=lambda fi: (str(fi[0].parent), fi[1].get("first_ts", ""), fi[0].name))
    seen: dict[Path, set[str]] = {}
    return [_read(f, info, seen.setdefault(f.parent, set())) for f, info in chosen], skipped


def _read(path: Path, info: dict[str, Any], seen: set[str]) -> SessionLog:
    fmt = info.get("format", "claude_code")
    ing = CodexIngester(redact=False) if fmt == "codex" else ClaudeCodeIngester(redact=False)
    sid = str(info.get("session_id") or path.stem)
    log = SessionLog(path, fmt, sid, str(info.get("cwd") or ""), "", None)
    stats = IngestionStats()
    try:
        items = ing.parse_bytes(read_session_bytes(path), stats, {})
        inputs = AssemblyInputs(drop={i for i, it in enumerate(items) if it.get("u") in seen})
        seen.update(it["u"] for it in items if "u" in it)
        convs = ing.assemble(path, items, stats, inputs)
    except SessionFileError as e:
        log.error = str(e)
        return log
    except (Exception, RecursionError) as e:  # one file's surprise must not stop the others
        log.error = f"{path}: {type(e).__name__}: {str(e)[:200]}"
        return log
    main = next((c for c in convs if c.suffix == ""), None)
    if main is None:
        log.error = f"{path}: no conversation in the file"
        return log
    log.conversation = main
    log.session_id = str(main.meta.get("session_id") or sid)
    log.cwd = str(main.meta.get("cwd") or log.cwd)
    log.branch = str(main.meta.get("branch") or "")
    return log
