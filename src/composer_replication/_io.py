"""Small I/O helpers every stage uses: atomic writes, append-only JSONL, located read errors, content hashes.

Writers are atomic (temp file in the same directory + fsync + rename) or append-only with one
``write`` per record followed by flush+fsync, so a crash never leaves a half-written file that a
rerun mistakes for finished work.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import orjson


class DataFileError(ValueError):
    """A record in a data file is malformed. The message names the file and the line."""

    def __init__(self, path: str | os.PathLike[str], line: int, problem: str, fix: str = "") -> None:
        self.path, self.line, self.problem = str(path), line, problem
        msg = f"{path}:{line}: {problem}"
        if fix:
            msg += f" ({fix})"
        super().__init__(msg)


@contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8"
) -> Iterator[IO[Any]]:
    """Open a temp file beside ``path``; on clean exit fsync and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, default=str) + "\n")


def write_jsonl_atomic(path: str | os.PathLike[str], records: Iterable[Any]) -> int:
    """Write all records to ``path`` atomically; returns the count."""
    n = 0
    with atomic_open(path, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
            n += 1
    return n


class JsonlAppender:
    """Append-only JSONL writer: one complete line per record, flushed and fsynced.

    A torn last line (crash mid-write) is tolerated by :func:`read_jsonl` with ``tolerate_torn_tail``.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True, fast: bool = False) -> None:
        """``fast``: serialise with orjson (several times quicker; NaN and inf become null), for hot
        paths whose records never hold them (the replay cache and spend ledger)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        self._fast = fast
        # Make sure a torn tail from a previous crash does not glue onto the next record.
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                last = fh.read(1)
            if last != b"\n":
                with open(self.path, "ab") as fh:
                    fh.write(b"\n")
        self._fh = open(self.path, "ab")

    def write(self, record: Any) -> None:
        if self._fast:
            line = orjson.dumps(record, default=str, option=orjson.OPT_APPEND_NEWLINE)
        else:
            line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        self._fh.write(line)
        self._fh.flush()
        if self._fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def swap_in_dir(tmp: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Move the finished folder ``tmp`` to ``target``, replacing what was there: the old folder is moved
    aside first and removed only once the new one is in place, so a crash leaves one of the two whole."""
    tmp, target = Path(tmp), Path(target)
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def read_jsonl(
    path: str | os.PathLike[str], *, tolerate_torn_tail: bool = True, skip_bad: bool = False
) -> Iterator[dict[str, Any]]:
    """Yield the JSON records of ``path``.

    A malformed line raises :class:`DataFileError` naming file and line, unless ``skip_bad``.
    A malformed *last* line without a trailing newline is a torn append from a crash and is
    skipped when ``tolerate_torn_tail``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (did the previous stage run?)")
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a directory; expected a JSONL file (one JSON object per line)")
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    torn_tail = len(lines) > 0 and lines[-1] != b""
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if skip_bad or (tolerate_torn_tail and torn_tail and i == len(lines)):
                continue
            raise DataFileError(path, i, f"not valid JSON: {exc}", "fix or delete this line") from None
        if not isinstance(rec, dict):
            if skip_bad:
                continue
            raise DataFileError(path, i, f"expected a JSON object, got {type(rec).__name__}")
        yield rec


def hash_path(path: str | os.PathLike[str]) -> str | None:
    """sha256 of a file, or of a directory tree (relative names + contents, sorted); None if absent.

    Hidden entries (temp files of atomic writers, caches) are ignored so they never invalidate a stage.
    """
    p = Path(path)
    if not p.exists():
        return None
    h = hashlib.sha256()
    if p.is_file():
        _update_file(h, p)
        return h.hexdigest()
    for f in sorted(q for q in p.rglob("*") if q.is_file()):
        rel = f.relative_to(p)
        if any(part.startswith(".") for part in rel.parts):
            continue
        h.update(str(rel).encode() + b"\0")
        _update_file(h, f)
    return h.hexdigest()


def _update_file(h: Any, f: Path) -> None:
    with open(f, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
