"""What every session-format ingester shares: options, redaction accounting, the ingest entry points.

A format supplies ``_conversations(path, records, stats, seen_uuids)``: the file's records turned
into conversation segments; reading, building states/examples and counting redactions happen here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from composer_replication.ingestion._files import SessionFileError
from composer_replication.ingestion._reader import json_depth_exceeds, note_line, read_records
from composer_replication.ingestion._session import BuildOptions, IngestionStats, build, estimate_tokens
from composer_replication.ingestion.redact import Redactor


class SessionIngester:
    """Base of ``ClaudeCodeIngester`` and ``CodexIngester`` (each keeps its own public ``__init__``)."""

    source: str = ""

    def _setup(
        self,
        *,
        system_prompt: str,
        skip_sidechain: bool,
        strip_thinking: bool,
        max_history_tokens: int | None,
        token_counter: Callable[[str], int] | None,
        redact: bool,
        redactor: Redactor | None,
        example_max_tokens: int,
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

    def _conversations(
        self, path: Path, records: list[dict[str, Any]], stats: IngestionStats, seen: set[str] | None
    ) -> list[list[Any]]:
        raise TypeError(f"{type(self).__name__} must define _conversations")  # internal invariant

    def ingest(self, path: Path, *, seen_uuids: set[str] | None = None) -> Iterator[dict[str, Any]]:
        """Yield ``TraceState``s (``state_id = f"{path.stem}::{idx:04d}"``); examples land in ``last_examples``."""
        states, examples, stats = self.ingest_file(Path(path), seen_uuids=seen_uuids)
        self.last_stats, self.last_examples = stats, examples
        yield from states

    def ingest_file(
        self, path: Path, *, seen_uuids: set[str] | None = None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], IngestionStats]:
        """``(states, examples, stats)`` for one file. A file that cannot be read, or whose processing fails,
        gives no rows and ``stats.file_error`` (one line naming the problem); it never raises."""
        stats = IngestionStats(n_files=1)
        self.last_stats = stats
        before = dict(self.redactor.counts)
        linenos: list[int] = []
        try:
            records = read_records(path, stats, linenos)
            self._records, self._linenos = records, linenos
            convs = self._conversations(path, records, stats, seen_uuids)
            states, examples = build(convs, path.stem, self.opts, stats)
        except SessionFileError as exc:
            return [], [], _failed(stats, str(exc))
        except (Exception, RecursionError) as exc:  # one file's surprise must not stop the others
            return [], [], _failed(stats, f"{path}: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            self._records, self._linenos = [], []
        for k, v in self.redactor.counts.items():
            if v - before.get(k, 0):
                stats.redactions[k] = v - before.get(k, 0)
        return states, examples, stats

    _records: list[dict[str, Any]] = []
    _linenos: list[int] = []

    def _bad_record(self, rec: dict[str, Any], stats: IngestionStats, reason: str) -> None:
        """Count a record whose fields are unusable and remember its line number."""
        stats.n_malformed_records += 1
        lineno = next(
            (
                n
                for r, n in zip(self._records, self._linenos, strict=False)
                if r is rec or r.get("payload") is rec
            ),
            0,
        )
        note_line(stats, lineno, reason)

    def _tool_input(self, value: Any) -> Any:
        """A tool call's input, redacted; refuses absurd nesting (every encoder downstream has a depth limit)."""
        if isinstance(value, (dict, list)) and json_depth_exceeds(value, MAX_INPUT_DEPTH):
            raise ValueError(f"tool input nested deeper than {MAX_INPUT_DEPTH} levels")
        return self.redactor.redact_obj(value)


MAX_INPUT_DEPTH = 100


def _failed(stats: IngestionStats, message: str) -> IngestionStats:
    stats.file_error = message
    stats.n_file_errors = 1
    return stats
