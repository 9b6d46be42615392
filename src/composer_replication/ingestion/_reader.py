"""Tolerant JSONL reading shared by both parsers: every bad line is counted, none raises."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from composer_replication.ingestion import _json
from composer_replication.ingestion._session import IngestionStats


def read_records(path: Path, stats: IngestionStats) -> list[dict[str, Any]]:
    """Parse every line of ``path``; count blank-skipped, non-UTF-8 and unparseable lines in ``stats``.

    Lines with invalid UTF-8 are decoded with U+FFFD replacement and parsed if still valid JSON (the bad
    byte usually sits inside a string). A torn last line (a session still being written) is one more bad line.
    """
    data = path.read_bytes()
    out: list[dict[str, Any]] = []
    loads = _json.loads
    for line in data.split(b"\n"):
        if not line or line.isspace():
            continue
        stats.n_lines += 1
        try:
            rec = loads(line)
        except (_json.JSONDecodeError, UnicodeDecodeError):
            rec = _slow_parse(line, stats)
        if type(rec) is not dict:
            stats.skipped_truncated_lines += 1
            continue
        out.append(rec)
    stats.n_records_total += len(out)
    return out


def _slow_parse(line: bytes, stats: IngestionStats) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        stats.n_non_utf8_lines += 1
        text = line.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def version_tuple(v: Any) -> tuple[int, int, int] | None:
    if not isinstance(v, str):
        return None
    m = _VERSION_RE.match(v)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def check_version(
    v: Any, lo: tuple[int, int, int], hi: tuple[int, int, int], what: str, path: Path, warnings: list[str]
) -> None:
    """Append a warning when a session was written by a CLI version outside the range we tested."""
    t = version_tuple(v)
    if t is None:
        return
    if t > hi:
        msg = f"{path.name}: {what} {v} is newer than the newest tested ({'.'.join(map(str, hi))}); check the output"
    elif t < lo:
        msg = f"{path.name}: {what} {v} is older than the oldest tested ({'.'.join(map(str, lo))}); check the output"
    else:
        return
    if msg not in warnings:
        warnings.append(msg)


def text_of(content: Any) -> str:
    """Flatten a message/tool-result ``content`` (string, or list of text/image blocks) to text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for b in content:
            if isinstance(b, str):
                parts.append(b)
            elif isinstance(b, dict):
                t = b.get("type")
                if t in ("text", "input_text", "output_text"):
                    parts.append(str(b.get("text") or ""))
                elif t in ("image", "input_image"):
                    parts.append("[image]")
                elif "text" in b:
                    parts.append(str(b["text"]))
        return "\n".join(parts)
    if content is None:
        return ""
    return json.dumps(content, ensure_ascii=False, default=str)
