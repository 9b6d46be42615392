"""Trace-source adapters: Claude Code and Codex CLI sessions -> ``states.jsonl`` + ``traces.jsonl``.

``ingest_paths`` is the library entry point the pipeline and the ``ingest`` CLI call: it finds session files,
detects each file's format, deduplicates records repeated by resumed sessions (within a project folder),
redacts secrets (on by default) and writes both outputs atomically, plus ``ingest_stats.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_open, atomic_write_json
from composer_replication.ingestion import _json
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
]

_CODEX_HINTS = (b'"session_meta"', b'"response_item"', b'"event_msg"', b'"turn_context"', b'"record_type"')


def detect_format(path: Path) -> str:
    """``"codex"`` or ``"claude_code"``, from the first lines of the file (then its name)."""
    with open(path, "rb") as fh:
        head = fh.read(65536)
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
    """Expand files and folders to ``*.jsonl`` files; a folder is searched recursively."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(f for f in p.rglob("*.jsonl") if f.is_file())
            if skip_sidechain:
                files = [f for f in files if not is_subagent_path(f.relative_to(p))]
            out.extend(files)
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(
                f"{p}: no such file or folder (pass a session .jsonl, a project folder or ~/.claude/projects)"
            )
    return list(dict.fromkeys(out))


def _first_timestamp(path: Path) -> str:
    with open(path, "rb") as fh:
        for line in fh:
            try:
                ts = _json.loads(line).get("timestamp")
            except (_json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                continue
            if isinstance(ts, str):
                return ts
    return ""


def _fingerprint(files: Sequence[Path], options: dict[str, Any]) -> str:
    h = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


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
    files = find_session_files(paths, skip_sidechain=skip_sidechain)
    if not files:
        raise FileNotFoundError(f"no *.jsonl session files under {', '.join(map(str, paths))}")
    if not redact:
        warnings.warn(
            "secret redaction is OFF: API keys in the sessions will be written to disk", stacklevel=2
        )
    options = {
        "redact": redact, "system_prompt": system_prompt, "skip_sidechain": skip_sidechain,
        "strip_thinking": strip_thinking, "max_history_tokens": max_history_tokens,
        "example_max_tokens": example_max_tokens, "token_counter": getattr(token_counter, "__qualname__", None),
    }  # fmt: skip
    fingerprint = _fingerprint(files, options)
    stats_path = out / "ingest_stats.json"
    if (
        not force
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
    # Resumed sessions copy records into a new file of the same project folder: dedup by uuid per folder,
    # earliest session first (so the copy kept is the original), and forget the set between folders so
    # that memory does not grow with the number of projects.
    by_dir: dict[Path, list[Path]] = {}
    for f in files:
        by_dir.setdefault(f.parent, []).append(f)
    total = IngestionStats()
    per_file: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True, desc="ingest")
    with (
        atomic_open(out / "states.jsonl", "wb", encoding=None) as sfh,
        atomic_open(out / "traces.jsonl", "wb", encoding=None) as tfh,
    ):
        for folder in sorted(by_dir):
            seen: set[str] = set()
            for f in sorted(by_dir[folder], key=lambda p: (_first_timestamp(p), p.name)):
                fmt = detect_format(f)
                states, examples, st = ingesters[fmt].ingest_file(f, seen_uuids=seen)
                _write_states(sfh, states)
                for ex in examples:
                    tfh.write(_json.dumps(ex) + b"\n")
                total.add(st)
                per_file.append({"file": str(f), "format": fmt, "states": st.n_states_emitted,
                                 "examples": st.n_examples, "tool_errors": st.n_tool_errors,
                                 "bad_lines": st.skipped_truncated_lines})  # fmt: skip
                if bar is not None:
                    bar.update(f.stat().st_size)
    if bar is not None:
        bar.close()
    result = {"fingerprint": fingerprint, "out_dir": str(out), "totals": total.to_dict(), "files": per_file}
    atomic_write_json(stats_path, result)
    return result


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
