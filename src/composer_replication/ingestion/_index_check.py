"""What a rerun trusts of ``ingest_index.json``: only entries that hold up; the files of the others are rebuilt.

The index is a cache, written by this package and vouched for by a checksum per entry (``check``, a hash of
the rest of the entry). An entry whose checksum, types, part name or byte ranges do not hold (edited by hand,
written by another version, damaged) never reaches the ingest as it is:

* the part name must be the hash of the entry's own path (:func:`_index.part_name`: 16 hex digits), so no
  name can point outside ``parts/`` (``../x``); size, mtime and format must be there with their types; else
  the entry is dropped and the file parsed as if new;
* the checksum must match and the parse state (resume offset within the file, fingerprint, counters) must
  have its types; else only the file's identity is kept and it is parsed again from the start
  ("rewritten");
* the saved byte ranges of its rows must be pairs of integers inside the previous outputs, on line
  boundaries (:func:`drop_bad_ranges`, once the outputs are mapped); else the file is re-assembled from its
  part instead of copied.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from composer_replication.ingestion import _index as ix
from composer_replication.ingestion import _json
from composer_replication.ingestion._folder import OUTPUTS, PARSE_STATE
from composer_replication.ingestion._session import IngestionStats

FORMATS = ("claude_code", "codex")
_PART_RX = re.compile(r"[0-9a-f]{16}")
_IDENTITY = ("part", "format", "first_ts", "cwd", "session_id")  # kept when the parse state is dropped
_STATS_TYPES = {f.name: f.type for f in fields(IngestionStats)}
_STATS_DICTS = ("lines", "tail_lines", "asm_stats", "stats")


def _int(v: Any, lo: int = 0) -> bool:
    return type(v) is int and v >= lo


def _str_or_none(v: Any) -> bool:
    return v is None or type(v) is str


def _stats_ok(d: Any) -> bool:
    """Saved counters :meth:`IngestionStats.from_dict` and ``add`` can take: known names, each of its kind."""
    if type(d) is not dict:
        return False
    for k, v in d.items():
        kind = _STATS_TYPES.get(k)
        if kind is None:
            return False
        if kind == "int":
            ok = type(v) is int
        elif kind.startswith("dict"):
            ok = type(v) is dict and all(type(x) is str and type(n) is int for x, n in v.items())
        elif kind.startswith("list"):
            ok = type(v) is list and all(type(x) in (str, dict) for x in v)
        else:  # file_error
            ok = _str_or_none(v)
        if not ok:
            return False
    return True


def _identity_ok(key: Any, e: Any) -> bool:
    return (
        type(key) is str
        and type(e) is dict
        and type(e.get("part")) is str
        and _PART_RX.fullmatch(e["part"]) is not None
        and e["part"] == ix.part_name(key)
        and e.get("format") in FORMATS
        and _int(e.get("size"))
        and _int(e.get("mtime_ns"), -(1 << 63))
        and type(e.get("first_ts", "")) is str
        and all(type(e.get(k, "")) is str for k in ("cwd", "session_id"))
    )


def _parse_state_ok(e: dict[str, Any]) -> bool:
    if "offset" not in e:  # never parsed to the end (a file that failed): nothing to resume from
        return not (PARSE_STATE & e.keys())
    return (
        _int(e["offset"])
        and e["offset"] <= e["size"]
        and _str_or_none(e.get("tail"))
        and _int(e.get("part_bytes"))
        and _int(e.get("n_lines"))
        and type(e.get("ctx")) is dict
        and all(_stats_ok(e.get(k, {})) for k in _STATS_DICTS)
        and type(e.get("asm_key", "")) is str
        and type(e.get("ranges_of", "")) is str
    )


def _ranges_ok(ranges: Any, sizes: dict[str, int]) -> bool:
    if type(ranges) is not dict or set(ranges) != set(OUTPUTS):
        return False
    for name, r in ranges.items():
        if not (type(r) is list and len(r) == 2 and _int(r[0]) and _int(r[1])):
            return False
        if not r[0] <= r[1] <= sizes.get(name, -1):
            return False
    return True


def check_entry(key: Any, e: Any, sizes: dict[str, int]) -> dict[str, Any] | None:
    """The part of index entry ``e`` (for source file ``key``) a rerun may trust, or ``None`` for nothing."""
    if not _identity_ok(key, e):
        return None
    body = {k: v for k, v in e.items() if k != "check"}
    if e.get("check") != ix.digest(body) or not _parse_state_ok(body):
        # Parse it again from the start: never "unchanged" (size -1), no state to resume from.
        return {**{k: body[k] for k in _IDENTITY if k in body}, "size": -1, "mtime_ns": body["mtime_ns"]}
    if "ranges" in body and not _ranges_ok(body["ranges"], sizes):
        body.pop("ranges")
    return body


def check_index(idx: dict[str, Any]) -> dict[str, Any]:
    """``idx`` with every field a rerun reads of the right type and every entry passed by :func:`check_entry`."""
    sizes = idx.get("output_sizes")
    if not (type(sizes) is dict and all(type(k) is str and _int(v) for k, v in sizes.items())):
        sizes = {}
    folders = idx.get("folders")
    if not (type(folders) is dict and all(type(v) is str for v in folders.values())):
        folders = {}
    files = idx.get("files") if type(idx.get("files")) is dict else {}
    assert isinstance(files, dict)
    kept = {k: c for k, e in files.items() if (c := check_entry(k, e, sizes)) is not None}
    outputs = idx.get("outputs") if type(idx.get("outputs")) is str else None
    return {**idx, "files": kept, "folders": folders, "outputs": outputs, "output_sizes": sizes}


def seal(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with its checksum (what :func:`check_entry` verifies on the next run)."""
    body = {k: v for k, v in entry.items() if k != "check"}
    return {**body, "check": ix.digest(body)}


def drop_bad_ranges(entries: Iterable[dict[str, Any]], old: dict[str, Any], outputs: str | None) -> None:
    """Forget the byte ranges (re-assemble instead of copying) of rows that are not the file's own in the
    previous outputs ``old`` (name -> bytes): each range must start and end on line boundaries, the sessions
    rows must name the file's part, and the first and last state and example rows one of those sessions'
    traces. Only ranges into those outputs (``ranges_of``) are looked at."""
    for e in entries:
        rng = e.get("ranges")
        if rng is not None and e.get("ranges_of") == outputs and not _rows_are_its_own(e, rng, old):
            e.pop("ranges")


def _rows_are_its_own(e: dict[str, Any], rng: dict[str, list[int]], old: dict[str, Any]) -> bool:
    for name, (a, b) in rng.items():
        buf = old.get(name)
        if buf is None or not (a == b or (_line_start(buf, a, name) and buf[b - 1] == 10)):
            return False
    try:
        a, b = rng["sessions.jsonl"]
        rows = [_json.loads(x) for x in bytes(old["sessions.jsonl"][a:b]).splitlines()]
        if any(r["part"] != e["part"] for r in rows):
            return False
        traces = {r["trace_id"] for r in rows}
        for name in ("states.jsonl", "traces.jsonl"):
            a, b = rng[name]
            if a == b:
                continue
            buf = old[name]
            first = _json.loads(bytes(buf[a : buf.find(b"\n", a, b)]))
            last = _json.loads(bytes(buf[max(a, buf.rfind(b"\n", a, b - 1) + 1) : b - 1]))
            if first["trace_id"] not in traces or last["trace_id"] not in traces:
                return False
    except (ValueError, KeyError, TypeError, _json.JSONDecodeError):
        return False
    return True


def _line_start(buf: Any, a: int, name: str) -> bool:
    return buf[a - 1] == 10 if a else name == "sessions.jsonl"  # the others start with their header line
