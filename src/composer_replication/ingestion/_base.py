"""What every session-format ingester shares: options, the two phases, redaction accounting, entry points.

Ingestion runs in two phases so that an appended session resumes where it stopped:

1. **parse** (:meth:`SessionIngester.parse_bytes`): each line becomes one compact, redacted *item* (or
   nothing), a pure function of the line and a small per-file context (``ctx``: session id, cwd, CLI version
   seen so far). Items are what the store keeps (``parts/<part>.jsonl``); new lines append new items.
2. **assemble** (:meth:`SessionIngester.assemble`): a file's items become conversations (branch selection,
   turn merging, tool pairing, compaction segments, subagent runs), then traces and references (``_build``).

A format supplies ``parse_record(rec, stats, ctx)`` and ``assemble(path, items, stats, inputs)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_replication.ingestion._build import Trace, build_traces, example_row, state_rows
from composer_replication.ingestion._files import SessionFileError, read_session_bytes
from composer_replication.ingestion._reader import iter_records, json_depth_exceeds, note_line
from composer_replication.ingestion._session import (
    BuildOptions,
    Conversation,
    IngestionStats,
    estimate_tokens,
)
from composer_replication.ingestion.errors import classify_error, detect_failure
from composer_replication.ingestion.redact import Redactor, compact_json
from composer_replication.wire import SYSTEM_PROMPT

MAX_INPUT_DEPTH = 100
_RECORD_ERRORS = (TypeError, AttributeError, ValueError, KeyError, RecursionError)


@dataclass
class AssemblyInputs:
    """What assembling one file needs besides its items (all of it is stored, so a reader can re-assemble)."""

    drop: set[int] = field(default_factory=set)  # item indices already seen in an earlier file of the folder
    agents_with_files: set[str] = field(default_factory=set)  # subagent ids that have their own transcript
    link: dict[str, Any] = field(default_factory=dict)  # a subagent transcript's parent (from its .meta.json)


def mark_failure(
    item: dict[str, Any], text: str, *, is_error_flag: bool, structured: Any = None, denial: Any = None
) -> dict[str, Any]:
    """``item`` (a tool result) marked failed (``f``), with its error kind (``ek``) and exit code (``c``),
    when :func:`~composer_replication.ingestion.errors.detect_failure` says ``text`` failed."""
    failed, code = detect_failure(text, is_error_flag=is_error_flag, structured=structured)
    if failed:
        item["f"] = 1
        item["ek"] = classify_error(text, exit_code=code, denial=denial)
        if code is not None:
            item["c"] = code
    return item


class SessionIngester:
    """Base of ``ClaudeCodeIngester`` and ``CodexIngester``: their one ``__init__`` (API reference §8)."""

    source: str = ""

    def __init__(
        self,
        *,
        system_prompt: str = SYSTEM_PROMPT,
        skip_sidechain: bool = True,
        strip_thinking: bool = True,
        max_history_tokens: int | None = None,
        token_counter: Callable[[str], int] | None = None,
        redact: bool = True,
        redactor: Redactor | None = None,
        example_max_tokens: int = 8192,
    ) -> None:
        self.opts = BuildOptions(
            system_prompt=system_prompt,
            strip_thinking=strip_thinking,
            max_history_tokens=max_history_tokens,
            token_counter=token_counter or estimate_tokens,
            example_max_tokens=example_max_tokens,
            source=self.source,
        )
        self.skip_sidechain = skip_sidechain
        self.redactor = redactor or Redactor(enabled=redact)
        self.last_stats = IngestionStats()
        self.last_examples: list[dict[str, Any]] = []

    # -- the two phases (formats override parse_record and assemble) ----------------------------------------

    def parse_record(
        self, rec: dict[str, Any], stats: IngestionStats, ctx: dict[str, Any]
    ) -> dict[str, Any] | None:
        raise TypeError(f"{type(self).__name__} must define parse_record")  # internal invariant

    def assemble(
        self, path: Path, items: list[dict[str, Any]], stats: IngestionStats, inputs: AssemblyInputs
    ) -> list[Conversation]:
        raise TypeError(f"{type(self).__name__} must define assemble")  # internal invariant

    def node_only(self, rec: dict[str, Any]) -> dict[str, Any] | None:
        """What is kept of a record whose content could not be used (Claude Code: its place in the tree)."""
        return None

    def parse_bytes(
        self, data: bytes | list[bytes], stats: IngestionStats, ctx: dict[str, Any], first_line: int = 1
    ) -> list[dict[str, Any]]:
        """Items of the complete lines in ``data`` (bytes, or its lines already split at ``\\n``; line-level
        counters and redactions go to ``stats``)."""
        before = dict(self.redactor.counts)
        items: list[dict[str, Any]] = []
        parse = self.parse_record
        for lineno, rec in iter_records(data, stats, first_line):
            try:
                it = parse(rec, stats, ctx)
            except _RECORD_ERRORS as exc:
                # A record whose fields have unexpected types: count it, keep the rest of the session.
                stats.n_malformed_records += 1
                note_line(stats, lineno, f"unusable {_type_name(rec)} record: {str(exc)[:80]}")
                it = self.node_only(rec)
            if it is not None:
                items.append(it)
        for k, v in self.redactor.counts.items():
            if v - before.get(k, 0):
                stats.redactions[k] = stats.redactions.get(k, 0) + v - before.get(k, 0)
        return items

    def traces(
        self,
        path: Path,
        items: list[dict[str, Any]],
        stats: IngestionStats,
        inputs: AssemblyInputs,
        base_id: str | None = None,
    ) -> list[Trace]:
        convs = self.assemble(path, items, stats, inputs)
        traces = build_traces(convs, path.stem if base_id is None else base_id, self.opts, stats)
        stats.n_traces += len(traces)
        return traces

    # -- the library entry points (one file, in memory) -----------------------------------------------------

    def ingest(self, path: Path, *, seen_uuids: set[str] | None = None) -> Iterator[dict[str, Any]]:
        """Yield ``TraceState``s (``state_id = f"{path.stem}::{idx:04d}"``); examples land in ``last_examples``.

        A file that cannot be read yields nothing and says why in ``last_stats.file_error`` (never raises).
        """
        states, examples, stats = self.ingest_file(Path(path), seen_uuids=seen_uuids)
        self.last_stats, self.last_examples = stats, examples
        yield from states

    def ingest_file(
        self, path: Path, *, seen_uuids: set[str] | None = None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], IngestionStats]:
        """``(states, examples, stats)`` of one file, materialised. A file that cannot be read, or whose
        processing fails, gives no rows and ``stats.file_error`` (one line naming the problem)."""
        stats = IngestionStats(n_files=1)
        self.last_stats = stats
        try:
            items = self.parse_bytes(read_session_bytes(path), stats, {})
            inputs = AssemblyInputs()
            if seen_uuids is not None:
                inputs.drop = {i for i, it in enumerate(items) if it.get("u") in seen_uuids}
                seen_uuids.update(it["u"] for it in items if "u" in it)
            traces = self.traces(path, items, stats, inputs)
            states = [row for t in traces for row in state_rows(t, t.states)]
            examples = [example_row(t, ref) for t in traces for ref in t.examples]
        except SessionFileError as exc:
            return [], [], failed(stats, str(exc))
        except (Exception, RecursionError) as exc:  # one file's surprise must not stop the others
            return [], [], failed(stats, f"{path}: {type(exc).__name__}: {str(exc)[:200]}")
        return states, examples, stats

    def _tool_input(self, value: Any) -> Any:
        """A tool call's input, redacted; refuses absurd nesting (every encoder downstream has a depth limit)."""
        if not isinstance(value, (dict, list)):
            return self.redactor.redact_obj(value)
        encoded = compact_json(value)  # one encoding bounds the depth and is scanned for secrets
        if _may_nest_deeper(encoded) and json_depth_exceeds(value, MAX_INPUT_DEPTH):
            raise ValueError(f"tool input nested deeper than {MAX_INPUT_DEPTH} levels")
        return self.redactor.redact_json(value, encoded)


def _may_nest_deeper(encoded: bytes | None) -> bool:
    """False when a value cannot nest deeper than ``MAX_INPUT_DEPTH``: its JSON text (``encoded``) has no more
    brackets than that (each level opens one; brackets inside strings only raise the count). A cheap C-level
    bound that spares the Python walk of :func:`json_depth_exceeds` for the ordinary, shallow tool input."""
    return encoded is None or encoded.count(b"{") + encoded.count(b"[") > MAX_INPUT_DEPTH


def _type_name(rec: dict[str, Any]) -> str:
    t = rec.get("type")
    if isinstance(t, str) and isinstance(rec.get("payload"), dict):
        pt = rec["payload"].get("type")
        return f"{t}/{pt}" if isinstance(pt, str) else t
    return t if isinstance(t, str) else "untyped"


def failed(stats: IngestionStats, message: str) -> IngestionStats:
    stats.file_error = message
    stats.n_file_errors = 1
    return stats
