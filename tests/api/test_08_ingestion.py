"""API reference §8, `composer_replication.ingestion` and `.claude_code`: `SYSTEM_PROMPT`, `IngestionStats`,
`ClaudeCodeIngester`."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from ._helpers import check_dataclass, check_signature, sig_id

# §8 ingestion
SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        "composer_replication.ingestion.claude_code",
        "ClaudeCodeIngester.__init__",
        """
        def __init__(
         self,
         *,
         system_prompt: str = SYSTEM_PROMPT,
         skip_sidechain: bool = True,
         strip_thinking: bool = True,
         max_history_tokens: int | None = None,
        ) -> None
        """,
        "def",
    ),
    (
        "composer_replication.ingestion.claude_code",
        "ClaudeCodeIngester.ingest",
        "def ingest(self, path: Path) -> Iterator[TraceState]",
        "def",
    ),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


DATACLASSES: list[tuple[str, str, str]] = [
    (
        "composer_replication.ingestion.claude_code",
        "IngestionStats",
        """
        @dataclass
        class IngestionStats:
         n_records_total: int = 0
         n_records_skipped: int = 0
         n_states_emitted: int = 0
         n_assistant_turns: int = 0
         n_tool_use_blocks: int = 0
         n_text_blocks: int = 0
         skipped_subagent: int = 0
         skipped_summary: int = 0
         skipped_truncated_lines: int = 0
         version_warnings: list[str] | None = None # initialized to [] in __post_init__
        """,
    ),
]


@pytest.mark.parametrize("row", DATACLASSES, ids=lambda r: r[1])
def test_dataclass_fields(row):
    check_dataclass(row)


MODULES = [
    "composer_replication.ingestion",
    "composer_replication.ingestion.claude_code",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_system_prompt_head():
    from composer_replication.ingestion.claude_code import SYSTEM_PROMPT

    assert SYSTEM_PROMPT.startswith(
        "You are a senior software engineer working as a coding agent in a terminal environment"
    )


def test_ingestion_stats_version_warnings_list():
    from composer_replication import IngestionStats

    a, b = IngestionStats(n_records_total=5), IngestionStats()
    assert a.version_warnings == [] and b.version_warnings == []
    assert a.version_warnings is not b.version_warnings


def test_claude_code_ingester_state_ids_and_stats():
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester, IngestionStats

    path = Path(__file__).parents[1] / "data" / "sessions" / "claude_code" / "marot__spotter__short.jsonl"
    ing = ClaudeCodeIngester()
    states = list(ing.ingest(path))
    assert states, "the short session yields at least one state"
    assert [s["state_id"] for s in states] == [f"{path.stem}::{i:04d}" for i in range(len(states))]
    assert isinstance(ing.last_stats, IngestionStats)
    assert ing.last_stats.n_states_emitted == len(states)
