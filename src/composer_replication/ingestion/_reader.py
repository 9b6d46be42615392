"""Tolerant JSONL reading shared by both parsers: every bad line is counted, none raises."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from composer_replication.ingestion import _json
from composer_replication.ingestion._files import read_session_bytes, split_lines
from composer_replication.ingestion._session import IngestionStats


def read_records(path: Path, stats: IngestionStats, linenos: list[int] | None = None) -> list[dict[str, Any]]:
    """Parse every line of ``path`` (see :func:`iter_records`); ``linenos`` receives each record's line number.
    Raises :class:`SessionFileError` when the file cannot be read at all (the caller records it per file)."""
    out: list[dict[str, Any]] = []
    for lineno, rec in iter_records(read_session_bytes(path), stats):
        out.append(rec)
        if linenos is not None:
            linenos.append(lineno)
    return out


def iter_records(
    data: bytes | list[bytes], stats: IngestionStats, first_line: int = 1
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for every line of ``data`` (bytes, or already split at ``\\n``) that is a JSON
    object; every other non-blank line is counted in ``stats`` (``skipped_truncated_lines``), never raised.

    Lines with invalid UTF-8 (or a lone ``\\ud800``-style surrogate escape) are repaired with U+FFFD and parsed if
    still valid JSON (the bad byte usually sits inside a string); integers too long for a 64-bit value become
    strings. A torn last line (a session still being written) is one more bad line. The first problem lines
    are named in ``stats.bad_lines`` (line number and reason).
    """
    loads = _json.loads
    decode_error = _json.JSONDecodeError
    n_ok = n_lines = 0
    try:
        for lineno, line in enumerate(split_lines(data) if isinstance(data, bytes) else data, first_line):
            if not line:
                continue
            try:
                rec = loads(line)
            except (decode_error, UnicodeDecodeError):
                if line.isspace():  # a blank line (never valid JSON): not counted
                    continue
                rec = _slow_parse(line, stats, lineno)
            n_lines += 1
            if type(rec) is not dict:
                stats.skipped_truncated_lines += 1
                if rec is not _BAD:
                    note_line(stats, lineno, "not a JSON object")
                continue
            n_ok += 1
            yield lineno, rec
    finally:
        stats.n_lines += n_lines
        stats.n_records_total += n_ok


_BAD = object()
MAX_NOTED_LINES = 5


def note_line(stats: IngestionStats, lineno: int, reason: str) -> None:
    """Remember the first few problem lines of a file (``stats.bad_lines``) for the summary."""
    if len(stats.bad_lines) < MAX_NOTED_LINES:
        stats.bad_lines.append({"line": lineno, "reason": reason})


def _slow_parse(line: bytes, stats: IngestionStats, lineno: int) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        stats.n_non_utf8_lines += 1
        note_line(stats, lineno, "invalid UTF-8 replaced with U+FFFD")
        text = line.decode("utf-8", "replace")
    big: list[str] = []

    def safe_int(digits: str) -> Any:
        v = int(digits) if len(digits) < 4300 else None
        if v is not None and -(2**63) <= v < 2**64:
            return v
        big.append(digits)  # orjson cannot encode it and int() refuses > 4300 digits: keep the digits as text
        return digits

    try:
        rec = json.loads(text, parse_int=safe_int)
    except RecursionError:
        note_line(stats, lineno, "nested too deeply to parse")
        return _BAD
    except ValueError as exc:
        note_line(stats, lineno, f"not JSON ({str(exc)[:80]})")
        return _BAD
    if big:
        note_line(stats, lineno, "integer too long for 64 bits kept as text")
    if _has_surrogate(text):
        rec, changed = _fix_surrogates(rec)
        if changed:
            stats.n_non_utf8_lines += 1
            note_line(stats, lineno, "lone surrogate escape replaced with U+FFFD")
    return rec


_SURROGATE_ESC = re.compile(r"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE = re.compile(f"[{chr(0xD800)}-{chr(0xDFFF)}]")  # lone surrogates (mypyc takes no surrogate literal)


def _has_surrogate(text: str) -> bool:
    return "\\u" in text and _SURROGATE_ESC.search(text) is not None


def _fix_surrogates(obj: Any) -> tuple[Any, bool]:
    """Replace lone surrogates in every string (keys too), iteratively: the value may be deeply nested."""
    changed = False

    def clean(s: str) -> str:
        nonlocal changed
        if _LONE.search(s) is None:
            return s
        changed = True
        return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")

    if isinstance(obj, str):
        return clean(obj), changed
    stack: list[Any] = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, str):
                    node[i] = clean(v)
                elif isinstance(v, (list, dict)):
                    stack.append(v)
        elif isinstance(node, dict):
            for k in list(node):
                v = node.pop(k)
                if isinstance(v, str):
                    v = clean(v)
                elif isinstance(v, (list, dict)):
                    stack.append(v)
                node[clean(k)] = v
    return obj, changed


def json_depth_exceeds(obj: Any, limit: int) -> bool:
    """True when ``obj`` nests lists/dicts deeper than ``limit`` (iterative: safe on any depth)."""
    stack = [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if d > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node if isinstance(v, (dict, list)))
    return False


_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def version_tuple(v: Any) -> tuple[int, int, int] | None:
    if not isinstance(v, str):
        return None
    m = _VERSION_RE.match(v)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def check_version(
    v: Any,
    lo: tuple[int, int, int],
    hi: tuple[int, int, int],
    what: str,
    name: str,
    warnings: list[str] | None,
) -> None:
    """Append a warning when a session was written by a CLI version outside the range we tested."""
    t = version_tuple(v)
    if t is None or warnings is None:
        return
    if t > hi:
        msg = (
            f"{name}: {what} {v} is newer than the newest tested ({'.'.join(map(str, hi))}); check the output"
        )
    elif t < lo:
        msg = (
            f"{name}: {what} {v} is older than the oldest tested ({'.'.join(map(str, lo))}); check the output"
        )
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
