"""Trace-source adapters: Claude Code and Codex CLI sessions -> ``states.jsonl`` + ``traces.jsonl``.

``ingest_paths`` is the library entry point the pipeline and the ``ingest`` CLI call: it finds session files,
detects each file's format, deduplicates records repeated by resumed sessions (within a project folder),
redacts secrets (on by default) and writes both outputs atomically, plus ``ingest_stats.json``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_open, atomic_write_json
from composer_replication.ingestion import _json
from composer_replication.ingestion._files import SessionFileError, read_session_bytes, scan_session_files
from composer_replication.ingestion._session import IngestionStats
from composer_replication.ingestion.claude_code import SYSTEM_PROMPT, ClaudeCodeIngester, is_subagent_path
from composer_replication.ingestion.codex import CodexIngester
from composer_replication.ingestion.redact import Redactor

__all__ = [
    "SYSTEM_PROMPT",
    "ClaudeCodeIngester",
    "CodexIngester",
    "IngestionStats",
    "Redactor",
    "default_session_roots",
    "detect_format",
    "find_session_files",
    "ingest_paths",
    "scan_session_files",
]

_CODEX_HINTS = (b'"session_meta"', b'"response_item"', b'"event_msg"', b'"turn_context"', b'"record_type"')


def detect_format(path: Path, head: bytes | None = None) -> str:
    """``"codex"`` or ``"claude_code"``, from the first lines of the file (then its name)."""
    if head is None:
        head = read_session_bytes(path, 65536)
    for line in head.split(b"\n")[:20]:
        if any(h in line for h in _CODEX_HINTS):
            return "codex"
        if b'"parentUuid"' in line or b'"sessionId"' in line or b'"leafUuid"' in line:
            return "claude_code"
        if line.startswith(b'{"id"') and b'"instructions"' in line:
            return "codex"
    return "codex" if path.name.startswith("rollout-") or ".codex" in path.parts else "claude_code"


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
    return scan_session_files(paths, keep=_keeper(skip_sidechain))[0]


def _keeper(skip_sidechain: bool) -> Callable[[Path, Path], bool] | None:
    if not skip_sidechain:
        return None
    return lambda f, root: not is_subagent_path(f.relative_to(root))


def _first_timestamp(head: bytes) -> str:
    for line in head.split(b"\n"):
        try:
            ts = _json.loads(line).get("timestamp")
        except (_json.JSONDecodeError, UnicodeDecodeError, AttributeError, RecursionError):
            continue
        if isinstance(ts, str):
            return ts
    return ""


def _fingerprint(files: Sequence[Path], sizes: dict[Path, tuple[int, int]], options: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
    for f in files:
        size, mtime = sizes.get(f, (-1, -1))
        h.update(f"{f.resolve()}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()


def _stat_all(files: Sequence[Path]) -> tuple[dict[Path, tuple[int, int]], dict[Path, str]]:
    sizes: dict[Path, tuple[int, int]] = {}
    errors: dict[Path, str] = {}
    for f in files:
        try:
            st = f.stat()
        except FileNotFoundError:
            errors[f] = f"{f}: no such file (deleted or moved after it was listed?)"
            continue
        except OSError as exc:
            errors[f] = f"{f}: cannot stat: {exc.strerror or exc}"
            continue
        sizes[f] = (st.st_size, st.st_mtime_ns)
    return sizes, errors


def ingest_paths(
    paths: Iterable[str | Path],
    out_dir: str | Path,
    *,
    redact: bool = True,
    system_prompt: str = SYSTEM_PROMPT,
    skip_sidechain: bool = True,
    strip_thinking: bool = True,
    max_history_tokens: int | None = None,
    example_max_tokens: int = 8192,
    token_counter: Callable[[str], int] | None = None,
    progress: bool = False,
    force: bool = False,
) -> dict[str, Any]:
    """Ingest session files/folders into ``out_dir/{states,traces}.jsonl`` and return the stats dict.

    Idempotent: the outputs are rewritten atomically and deterministically; when the inputs (paths, sizes,
    mtimes) and options are unchanged since the last run, nothing is redone (``force=True`` reruns).
    """
    out = Path(out_dir)
    paths = list(paths)
    files, skipped = scan_session_files(paths, keep=_keeper(skip_sidechain))
    if not files:
        why = (
            f" ({len(skipped)} entries skipped: {skipped[0]['path']}: {skipped[0]['reason']})"
            if skipped
            else ""
        )
        raise FileNotFoundError(f"no *.jsonl session files under {', '.join(map(str, paths))}{why}")
    if not redact:
        warnings.warn(
            "secret redaction is OFF: API keys in the sessions will be written to disk", stacklevel=2
        )
    options = {
        "redact": redact, "system_prompt": system_prompt, "skip_sidechain": skip_sidechain,
        "strip_thinking": strip_thinking, "max_history_tokens": max_history_tokens,
        "example_max_tokens": example_max_tokens, "token_counter": getattr(token_counter, "__qualname__", None),
    }  # fmt: skip
    sizes, stat_errors = _stat_all(files)
    fingerprint = _fingerprint(files, sizes, options)
    stats_path = out / "ingest_stats.json"
    if (
        not force
        and not stat_errors
        and stats_path.exists()
        and (out / "states.jsonl").exists()
        and (out / "traces.jsonl").exists()
    ):
        try:
            previous = json.loads(stats_path.read_text())
        except ValueError:
            previous = {}
        if previous.get("fingerprint") == fingerprint:
            return {**previous, "skipped_unchanged": True}

    redactor = Redactor(enabled=redact)
    kw = dict(system_prompt=system_prompt, strip_thinking=strip_thinking, max_history_tokens=max_history_tokens,
              token_counter=token_counter, redactor=redactor, example_max_tokens=example_max_tokens,
              skip_sidechain=skip_sidechain)  # fmt: skip
    ingesters = {"claude_code": ClaudeCodeIngester(**kw), "codex": CodexIngester(**kw)}
    total = IngestionStats()
    per_file: list[dict[str, Any]] = []
    heads: dict[Path, bytes] = {}
    for f in files:
        if f in stat_errors:
            continue
        try:
            heads[f] = read_session_bytes(f, 65536)
        except SessionFileError as exc:
            stat_errors[f] = str(exc)
    for f, err in stat_errors.items():
        total.n_files += 1
        total.n_file_errors += 1
        per_file.append({"file": str(f), "error": err})
    # Resumed sessions copy records into a new file of the same project folder: dedup by uuid per folder,
    # earliest session first (so the copy kept is the original), and forget the set between folders so
    # that memory does not grow with the number of projects.
    by_dir: dict[Path, list[Path]] = {}
    for f in heads:
        by_dir.setdefault(f.parent, []).append(f)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(sizes[f][0] for f in heads), unit="B", unit_scale=True, desc="ingest")
    with (
        atomic_open(out / "states.jsonl", "wb", encoding=None) as sfh,
        atomic_open(out / "traces.jsonl", "wb", encoding=None) as tfh,
    ):
        for folder in sorted(by_dir):
            seen: set[str] = set()
            for f in sorted(by_dir[folder], key=lambda p: (_first_timestamp(heads[p]), p.name)):
                fmt = detect_format(f, heads[f])
                states, examples, st = ingesters[fmt].ingest_file(f, seen_uuids=seen)
                row: dict[str, Any] = {"file": str(f), "format": fmt}
                try:
                    if st.file_error is None:
                        state_bytes = _encode_states(states)
                        trace_bytes = b"".join(_json.dumps(ex) + b"\n" for ex in examples)
                except Exception as exc:  # e.g. a value no encoder accepts: this file fails, the others go on
                    st = IngestionStats(n_files=1, n_file_errors=1, file_error=f"{f}: cannot encode: {exc}")
                if st.file_error is None:
                    sfh.write(state_bytes)
                    tfh.write(trace_bytes)
                    row.update(states=st.n_states_emitted, examples=st.n_examples, tool_errors=st.n_tool_errors,
                               bad_lines=st.skipped_truncated_lines)  # fmt: skip
                    if st.bad_lines:
                        row["first_bad_lines"] = st.bad_lines
                else:
                    row["error"] = st.file_error
                total.add(st)
                per_file.append(row)
                if bar is not None:
                    bar.update(sizes[f][0])
    if bar is not None:
        bar.close()
    result = {
        "fingerprint": fingerprint,
        "out_dir": str(out),
        "totals": {**total.to_dict(), "n_files_skipped": len(skipped)},
        "files": per_file,
        "skipped": skipped,
    }
    for k in ("bad_lines", "file_error"):
        result["totals"].pop(k, None)
    atomic_write_json(stats_path, result)
    return result


def _encode_states(states: list[dict[str, Any]]) -> bytes:
    buf = io.BytesIO()
    _write_states(buf, states)
    return buf.getvalue()


def _write_states(fh: Any, states: list[dict[str, Any]]) -> None:
    """Write state rows. Each message is encoded once; a state whose history extends the previous state's
    (the common case) reuses the previous encoded history instead of re-joining every message."""
    cache: dict[int, bytes] = {}
    dumps = _json.dumps
    prev_ids: list[int] = []
    prev_body = b""
    for st in states:
        msgs = st["messages"]
        ids = [id(m) for m in msgs]
        n = len(prev_ids)
        if n and len(ids) >= n and ids[:n] == prev_ids:
            new = msgs[n:]
            body = prev_body + b"".join(b"," + _enc(m, cache, dumps) for m in new) if new else prev_body
        else:
            body = b",".join(_enc(m, cache, dumps) for m in msgs)
        prev_ids, prev_body = ids, body
        rest = {k: v for k, v in st.items() if k not in ("state_id", "messages")}
        fh.write(
            b"".join(
                (
                    b'{"state_id":',
                    dumps(st["state_id"]),
                    b',"messages":[',
                    body,
                    b"],",
                    dumps(rest)[1:],
                    b"\n",
                )
            )
        )


def _enc(m: dict[str, Any], cache: dict[int, bytes], dumps: Any) -> bytes:
    b = cache.get(id(m))
    if b is None:
        b = cache[id(m)] = dumps(m)
    return b
