"""The per-file index of an ingest output folder and the item parts it points to (incremental ingest).

``ingest_index.json`` maps each source file to what a rerun needs to decide, cheaply, what to redo:

* ``size``, ``mtime_ns``: unchanged when both are equal (the file is not even opened);
* ``offset`` (end of the last complete line), ``tail`` (SHA-256 over the first 4 KiB, 16 evenly spaced 1 KiB
  blocks and the last 4 KiB before it): a file that grew and still has those bytes there was appended to, and
  parsing resumes at ``offset`` with the saved parser context (``ctx``) and line counters (``lines``);
  anything else is parsed again from the start. (An edit inside an old file that leaves all those bytes
  alone goes unnoticed: session logs are append-only; ``--force`` re-reads everything.)
* ``part``, ``part_bytes``: the file's items (``parts/<part>.jsonl``, append-only) and the length covering its
  complete lines (items of an unterminated last line follow and are cut before resuming);
* the last run's assembly (``asm_key``, per-file stats, byte ranges of its rows in the outputs), reused while
  the inputs of the assembly (items, duplicates dropped, options, trace id) stay the same.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_open
from composer_replication.ingestion import _json
from composer_replication.ingestion._files import split_lines

INDEX_VERSION = 4
TAIL_BYTES = 4096


def part_name(path: Path | str) -> str:
    """The part file name of a source file: a hash of its absolute path (symlinks not resolved)."""
    return hashlib.sha1(os.path.abspath(path).encode(), usedforsecurity=False).hexdigest()[:16]


def _spans(offset: int) -> list[tuple[int, int]]:
    """Where the fingerprint of the first ``offset`` bytes samples: the head, 16 evenly spaced 1 KiB blocks and
    the tail (all of it when short)."""
    if offset <= 2 * TAIL_BYTES + 16 * 1024:
        return [(0, offset)]
    step = offset // 17
    return [
        (0, TAIL_BYTES),
        *((k * step, k * step + 1024) for k in range(1, 17)),
        (offset - TAIL_BYTES, offset),
    ]


def tail_hash(data: bytes, offset: int) -> str:
    """Fingerprint of ``data[:offset]`` (SHA-256 of head, samples and tail; not a hash of every byte)."""
    h = hashlib.sha256(str(offset).encode())
    for a, b in _spans(offset):
        h.update(data[a:b])
    return h.hexdigest()


def file_tail_hash(path: Path, offset: int) -> str | None:
    """:func:`tail_hash` of the file on disk (None when it cannot be read)."""
    h = hashlib.sha256(str(offset).encode())
    try:
        with open(path, "rb") as fh:
            for a, b in _spans(offset):
                fh.seek(a)
                chunk = fh.read(b - a)
                if len(chunk) != b - a:
                    return None
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def load_index(out: Path, parse_options: dict[str, Any]) -> dict[str, Any]:
    """The previous run's index when it was made with the same parse options, else an empty one."""
    empty = {"version": INDEX_VERSION, "parse": parse_options, "files": {}, "folders": {}, "outputs": None}
    p = out / "ingest_index.json"
    try:
        idx = _json.loads(p.read_bytes())
    except (OSError, ValueError, _json.JSONDecodeError):
        return empty
    if not isinstance(idx, dict):
        return empty
    if idx.get("version") != INDEX_VERSION or idx.get("parse") != parse_options:
        return empty
    return idx


def save_index(out: Path, idx: dict[str, Any]) -> None:
    with atomic_open(out / "ingest_index.json", "wb", encoding=None) as fh:
        fh.write(_json.dumps(idx))


def encode_items(items: list[dict[str, Any]]) -> bytes:
    return _json.dumps_lines(items)


def read_part(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    with open(path, "rb") as fh:
        data = fh.read() if limit is None else fh.read(limit)
    loads = _json.loads
    return [loads(line) for line in split_lines(data) if line]


def write_part(path: Path, complete: bytes, tail: bytes) -> None:
    """A new or re-parsed file's items. Not fsynced: the index (written last, atomically) still describes the
    previous state until the run completes, and a file re-parsed from scratch never matches that state as
    "appended", so a part cut short by a crash is re-parsed, never trusted."""
    with open(path, "wb") as fh:
        fh.write(complete)
        fh.write(tail)


def append_part(path: Path, keep: int, complete: bytes, tail: bytes) -> None:
    """Cut the part back to its complete items (``keep`` bytes), then append: the first ``keep`` bytes, which
    the index vouches for, are never rewritten."""
    with open(path, "r+b") as fh:
        fh.truncate(keep)
        fh.seek(keep)
        fh.write(complete)
        fh.write(tail)


# -- uuid digests (cross-file duplicates of resumed sessions) -------------------------------------------------


_DIGEST = struct.Struct("<I16s")  # item index, 16-byte digest of its uuid


def uuid_digests(items: list[dict[str, Any]]) -> bytes:
    """``(item index, 16-byte digest of its uuid)`` for every item with a uuid, packed (20 bytes each)."""
    idx = [i for i, it in enumerate(items) if it.get("u") is not None]
    uuids = [items[i]["u"] for i in idx]
    digests = _all_uuid_bytes(uuids)
    if digests is None:
        return b"".join([_DIGEST.pack(i, _uuid_bytes(u)) for i, u in zip(idx, uuids, strict=True)])
    # The 20-byte records interleaved by strided copies, not a Python step per item.
    n = len(idx)
    indices = struct.pack(f"<{n}I", *idx)
    out = bytearray(20 * n)
    for j in range(4):
        out[j::20] = indices[j::4]
    for j in range(16):
        out[4 + j :: 20] = digests[j::16]
    return bytes(out)


def _all_uuid_bytes(uuids: list[Any]) -> bytes | None:
    """``_uuid_bytes`` of every uuid, concatenated, from one ``fromhex`` when each is a UUID (36 characters,
    4 dashes, 32 hex digits: what Claude Code writes); else ``None``. The checks are per uuid, so one
    ``fromhex`` of them all, dashes removed, gives each its own 16 bytes (it skips whitespace, but then the
    32 digits per uuid would not all be there)."""
    if not uuids or set(map(type, uuids)) != {str} or set(map(len, uuids)) != {36}:
        return None
    if set(map(str.count, uuids, itertools.repeat("-"))) != {4}:
        return None
    try:
        digests = bytes.fromhex("".join(uuids).replace("-", ""))
    except ValueError:
        return None
    return digests if len(digests) == 16 * len(uuids) else None


def _uuid_bytes(u: str) -> bytes:
    """A UUID's own 16 bytes (Claude Code uuids are UUIDs); a hash of anything else."""
    if len(u) == 36:
        try:
            b = bytes.fromhex(u.replace("-", ""))
        except ValueError:
            b = b""
        if len(b) == 16:
            return b
    return hashlib.blake2b(u.encode(), digest_size=16).digest()


def iter_digests(packed: bytes) -> list[tuple[int, bytes]]:
    return list(_DIGEST.iter_unpack(packed))


def to_ranges(indices: set[int]) -> list[list[int]]:
    """Sorted indices as ``[[start, end), ...]`` (resumed sessions copy a contiguous prefix: a few ranges)."""
    out: list[list[int]] = []
    for i in sorted(indices):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def expand_ranges(ranges: list[list[int]]) -> set[int]:
    return {i for a, b in ranges for i in range(a, b)}


def digest(obj: Any) -> str:
    """A short stable hash of JSON-like data (keys sorted)."""
    try:
        import orjson

        blob = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    except ImportError:  # pragma: no cover - orjson is optional
        blob = json.dumps(
            obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
        ).encode()
    return hashlib.sha256(blob).hexdigest()[:32]
