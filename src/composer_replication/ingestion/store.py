"""The reader API of an ingest output folder: every stage reads states and examples through it.

``ingest`` stores each session once (``parts/<part>.jsonl``: the parsed, redacted items of one session file)
and writes *references*: ``states.jsonl`` rows ``{"state_id", "trace_id", "turn", "from"?, "error_kind"?}`` and
``traces.jsonl`` rows ``{"example_id", "trace_id", "kind", "segment", "span", "open"?}``, each file opened by a
header line naming the store. This module turns references back into full rows on demand:

* :func:`read_states` -> ``TraceState`` dicts (``messages`` materialised with ``wire``), streaming;
* :func:`read_examples` -> ``TraceExample`` dicts (their ``turns``);
* :func:`read_sessions` -> one row per trace (source, project, start, title, token usage, counts);
* :func:`read_refs` / :func:`write_refs` -> filter references (a split, a replay selection) without
  materialising them; the new file points at the same store.

A states file from an older ingest (every row with its whole history) is refused with a one-line error
saying to re-ingest. Memory: one session file's traces are in memory at a time (a small LRU cache).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from composer_replication._io import DataFileError, atomic_open
from composer_replication.ingestion import _json
from composer_replication.ingestion._build import Trace, example_row, state_rows

__all__ = [
    "FORMAT_VERSION",
    "Store",
    "StoreFormatError",
    "read_examples",
    "read_refs",
    "read_rows",
    "read_sessions",
    "read_states",
    "write_refs",
]

FORMAT_VERSION = 2
STATES_FORMAT = "composer-replication/states"
EXAMPLES_FORMAT = "composer-replication/examples"
_REINGEST = (
    "re-ingest the sessions: composer-replication ingest PATHS --out DIR, or `run CONFIG --force ingest`"
)


class StoreFormatError(DataFileError):
    """A states/examples file that cannot be read with this version (old format, missing or changed store)."""


def header(kind: str, store_dir: Path, store_id: str, at: Path) -> dict[str, Any]:
    """The first line of a references file written at ``at``: the store path relative to it."""
    rel = os.path.relpath(store_dir.resolve(), at.resolve().parent)
    return {"_format": kind, "version": FORMAT_VERSION, "store": rel, "store_id": store_id}


def read_refs(
    path: str | os.PathLike[str], kind: str = STATES_FORMAT
) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """``(header, rows)`` of a references file, without materialising anything."""
    path = Path(path)
    if path.is_dir():
        raise StoreFormatError(
            path, 0, "is a directory", "pass the states.jsonl / traces.jsonl file inside it"
        )
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (did the previous stage run?)")
    fh = open(path, "rb")
    first = fh.readline()
    head = _parse(first, path, 1) if first.strip() else {}
    if head.get("_format") not in (STATES_FORMAT, EXAMPLES_FORMAT):
        fh.close()
        if "messages" in head and "state_id" in head:
            raise StoreFormatError(
                path,
                1,
                "written by an older ingest (format 1: every state carries its whole history)",
                _REINGEST,
            )
        raise StoreFormatError(path, 1, f"not a {kind} file of an ingest (no header line)", _REINGEST)
    if head.get("version") != FORMAT_VERSION:
        fh.close()
        raise StoreFormatError(
            path, 1, f"format version {head.get('version')} (this version reads {FORMAT_VERSION})", _REINGEST
        )
    return head, _rows(fh, path)


def _parse(line: bytes, path: Path, lineno: int) -> dict[str, Any]:
    try:
        rec = _json.loads(line)
    except (_json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataFileError(path, lineno, f"not valid JSON: {exc}", "fix or delete this line") from None
    if not isinstance(rec, dict):
        raise DataFileError(path, lineno, f"expected a JSON object, got {type(rec).__name__}")
    return rec


def _rows(fh: Any, path: Path) -> Iterator[dict[str, Any]]:
    with fh:
        for lineno, line in enumerate(fh, 2):
            if line.strip():
                yield _parse(line, path, lineno)


def write_refs(
    path: str | os.PathLike[str],
    head: dict[str, Any],
    rows: Iterable[dict[str, Any]],
    *,
    src: str | os.PathLike[str] | None = None,
) -> int:
    """Write references atomically to ``path``; ``head`` is the header they were read with (from ``src``'s
    folder), re-pointed at the same store from the new location. Returns the number of rows."""
    path = Path(path)
    store_dir = _store_dir(head, Path(src) if src is not None else path)
    new_head = {**head, "store": os.path.relpath(store_dir.resolve(), path.resolve().parent)}
    n = 0
    with atomic_open(path, "wb", encoding=None) as fh:
        fh.write(_json.dumps(new_head) + b"\n")
        for r in rows:
            fh.write(_json.dumps(r) + b"\n")
            n += 1
    return n


def _store_dir(head: dict[str, Any], refs_path: Path) -> Path:
    return (refs_path.parent / head.get("store", ".")).resolve()


class Store:
    """An ingest output folder opened for reading: the trace catalog, and traces assembled on demand."""

    def __init__(self, root: str | os.PathLike[str], *, cache_parts: int = 4) -> None:
        self.root = Path(root)
        meta_path = self.root / "store.json"
        if not meta_path.exists():
            raise StoreFormatError(
                self.root, 0, "no store.json here (not an ingest output folder, or moved)", _REINGEST
            )
        self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if self.meta.get("version") != FORMAT_VERSION:
            raise StoreFormatError(meta_path, 1, f"store format {self.meta.get('version')}", _REINGEST)
        self.store_id = self.meta["store_id"]
        self.catalog: dict[str, dict[str, Any]] = {}
        for row in _rows(open(self.root / "sessions.jsonl", "rb"), self.root / "sessions.jsonl"):
            self.catalog[row["trace_id"]] = row
        self._cache: OrderedDict[str, dict[str, Trace]] = OrderedDict()
        self._cache_parts = cache_parts
        self._ingesters: dict[str, Any] = {}

    def check(self, head: dict[str, Any], path: Path) -> None:
        if head.get("store_id") != self.store_id:
            raise StoreFormatError(
                path, 1, f"made from an earlier ingest of {self.root} (the store changed since)",
                "re-run the stage that wrote it (e.g. `run` re-splits after a new ingest)",
            )  # fmt: skip

    def _ingester(self, source: str) -> Any:
        if source not in self._ingesters:
            from composer_replication.ingestion.claude_code import ClaudeCodeIngester
            from composer_replication.ingestion.codex import CodexIngester

            o = self.meta["options"]
            cls = CodexIngester if source == "codex" else ClaudeCodeIngester
            self._ingesters[source] = cls(
                system_prompt=_system_prompt(o["system_prompt"]), skip_sidechain=o["skip_sidechain"],
                strip_thinking=o["strip_thinking"], redact=False, example_max_tokens=o["example_max_tokens"],
            )  # fmt: skip
        return self._ingesters[source]

    def trace(self, trace_id: str) -> Trace:
        row = self.catalog.get(trace_id)
        if row is None:
            raise StoreFormatError(
                self.root / "sessions.jsonl", 0, f"no trace {trace_id!r} in this store", _REINGEST
            )
        part = row["part"]
        traces = self._cache.get(part)
        if traces is None:
            traces = self._assemble(row)
            self._cache[part] = traces
            while len(self._cache) > self._cache_parts:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(part)
        if trace_id not in traces:
            raise StoreFormatError(
                self.root / "parts" / f"{part}.jsonl", 0, f"trace {trace_id!r} not assembled", _REINGEST
            )
        return traces[trace_id]

    def _assemble(self, row: dict[str, Any]) -> dict[str, Trace]:
        from composer_replication.ingestion._base import AssemblyInputs
        from composer_replication.ingestion._folder import no_gc
        from composer_replication.ingestion._index import expand_ranges, read_part
        from composer_replication.ingestion._session import IngestionStats

        asm = row["asm"]
        inputs = AssemblyInputs(
            drop=expand_ranges(asm.get("drop", [])),
            agents_with_files=set(asm.get("agents", [])),
            link=asm.get("link", {}),
        )
        with no_gc():
            items = read_part(self.root / "parts" / f"{row['part']}.jsonl")
            ing = self._ingester(row["source"])
            traces = ing.traces(Path(row["file"]), items, IngestionStats(), inputs, asm["base"])
        return {t.trace_id: t for t in traces}

    def states(self, refs: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Materialise state references (consecutive references of one trace are built in one pass)."""
        group: list[dict[str, Any]] = []
        for ref in refs:
            if group and ref["trace_id"] != group[0]["trace_id"]:
                yield from state_rows(self.trace(group[0]["trace_id"]), group)
                group = []
            group.append(ref)
        if group:
            yield from state_rows(self.trace(group[0]["trace_id"]), group)

    def examples(self, refs: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for ref in refs:
            yield example_row(self.trace(ref["trace_id"]), ref)


def _system_prompt(stored: str) -> str:
    """The system prompt a store was ingested with; a store written before native tool calls recorded the
    text format's default prompt, which now means the default."""
    from composer_replication import wire

    return wire.SYSTEM_PROMPT if stored == wire.TEXT_SYSTEM_PROMPT else stored


def open_store(head: dict[str, Any], refs_path: Path) -> Store:
    store = Store(_store_dir(head, refs_path))
    store.check(head, refs_path)
    return store


_OLD_INGEST_KEYS = frozenset({"state_id", "messages", "student_action", "trace_id", "turn_index", "source"})


def read_states(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """``TraceState`` rows of a states file (``messages`` materialised), streaming, in file order.

    Also reads a file of self-contained ``TraceState`` rows written by hand or by other tools (no header, each
    row with its ``messages``). A states file written by an older ``ingest`` (full histories) is refused with a
    one-line error saying to re-ingest.
    """
    path = Path(path)
    first = _first_row(path)
    if first is not None and "_format" not in first and "messages" in first:
        if _OLD_INGEST_KEYS <= first.keys():
            raise StoreFormatError(
                path,
                1,
                "written by an older ingest (format 1: every state carries its whole history)",
                _REINGEST,
            )
        from composer_replication._io import read_jsonl

        yield from read_jsonl(path)
        return
    head, rows = read_refs(path, STATES_FORMAT)
    yield from open_store(head, path).states(rows)


def _first_row(path: Path) -> dict[str, Any] | None:
    if path.is_dir():
        raise StoreFormatError(path, 0, "is a directory", "pass the states.jsonl file inside it")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (did the previous stage run?)")
    with open(path, "rb") as fh:
        first = fh.readline()
    try:
        row = _json.loads(first) if first.strip() else None
    except (_json.JSONDecodeError, UnicodeDecodeError):
        return None
    return row if isinstance(row, dict) else None


def read_examples(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """``TraceExample`` rows of an examples file (``traces.jsonl``), streaming, in file order."""
    head, rows = read_refs(path, EXAMPLES_FORMAT)
    yield from open_store(head, Path(path)).examples(rows)


def read_sessions(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """One row per trace of an ingest (``path``: the output folder or its ``sessions.jsonl``)."""
    p = Path(path)
    p = p / "sessions.jsonl" if p.is_dir() else p
    for row in _rows(open(p, "rb"), p):
        yield {k: v for k, v in row.items() if k != "asm"}


def read_rows(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Any JSONL file of the pipeline: a states/examples references file is materialised, anything else (pairs,
    old-format ``TraceExample`` rows) is read as it is."""
    from composer_replication._io import read_jsonl

    path = Path(path)
    with open(path, "rb") as fh:
        first = fh.readline()
    try:
        fmt = _json.loads(first).get("_format") if first.strip() else None
    except (_json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        fmt = None
    if fmt == STATES_FORMAT:
        yield from read_states(path)
    elif fmt == EXAMPLES_FORMAT:
        yield from read_examples(path)
    else:
        yield from read_jsonl(path)
