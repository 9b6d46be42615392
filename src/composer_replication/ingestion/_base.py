"""What every session-format ingester shares: options, redaction accounting, the ingest entry points.

A format supplies ``_conversations(path, records, stats, seen_uuids)``: the file's records turned
into conversation segments; reading, building states/examples and counting redactions happen here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from composer_replication.ingestion._reader import read_records
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
        stats = IngestionStats(n_files=1)
        self.last_stats = stats
        before = dict(self.redactor.counts)
        records = read_records(path, stats)
        convs = self._conversations(path, records, stats, seen_uuids)
        states, examples = build(convs, path.stem, self.opts, stats)
        for k, v in self.redactor.counts.items():
            if v - before.get(k, 0):
                stats.redactions[k] = v - before.get(k, 0)
        return states, examples, stats
