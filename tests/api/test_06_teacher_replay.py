"""API reference §6, `composer_replication.teacher_replay`: the TypedDicts, `DEFAULT_TEACHERS`,
`replay_trace`, `extract_dpo_pairs`, `save_pairs`."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from ._helpers import check_signature, check_typeddict, sig_id

# §6 teacher_replay
SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        "composer_replication.teacher_replay",
        "replay_trace",
        """
        async def replay_trace(
         states: Sequence[TraceState],
         teachers: Sequence[TeacherSpec] = tuple(DEFAULT_TEACHERS),
         max_total_usd: float = 5.0,
         api_key: str | None = None,
        ) -> list[TeacherCallResult]
        """,
        "async",
    ),
    (
        "composer_replication.teacher_replay",
        "extract_dpo_pairs",
        """
        def extract_dpo_pairs(
         states: Sequence[TraceState],
         teacher_actions: Sequence[TeacherCallResult],
         agreement_threshold: int = 2,
        ) -> list[DPOPair]
        """,
        "def",
    ),
    (
        "composer_replication.teacher_replay",
        "save_pairs",
        "def save_pairs(pairs: Sequence[DPOPair], path: str | Path) -> None",
        "def",
    ),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


TYPEDDICTS: list[tuple[str, str, str]] = [
    (
        "composer_replication.teacher_replay",
        "TeacherSpec",
        """
        class TeacherSpec(TypedDict):
         slug: str
         input_per_mtok: float
         output_per_mtok: float
        """,
    ),
    (
        "composer_replication.teacher_replay",
        "TraceState",
        """
        class TraceState(TypedDict):
         state_id: str # unique within the trace
         messages: list[dict] # OpenAI-style chat history up to (and incl.) this user prompt
         student_action: str # what the student actually did at this step
        """,
    ),
    (
        "composer_replication.teacher_replay",
        "TeacherCallResult",
        """
        class TeacherCallResult(TypedDict):
         state_id: str
         teacher_slug: str
         response_text: str | None # None on error
         latency_s: float
         prompt_tokens: int
         completion_tokens: int
         cost_usd: float
         error: str | None # None on success
        """,
    ),
    (
        "composer_replication.teacher_replay",
        "DPOPair",
        """
        class DPOPair(TypedDict):
         state_id: str
         state_messages: list[dict]
         chosen: str # teacher-consensus action
         rejected: str # student action
         n_teachers_agreeing: int
        """,
    ),
]


@pytest.mark.parametrize("row", TYPEDDICTS, ids=lambda r: r[1])
def test_typeddict_keys(row):
    check_typeddict(row)


MODULES = [
    "composer_replication.teacher_replay",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_default_teachers():
    from composer_replication.teacher_replay import DEFAULT_TEACHERS

    assert [t["slug"] for t in DEFAULT_TEACHERS] == [
        "anthropic/claude-opus-4.7",
        "openai/gpt-5",
        "deepseek/deepseek-v4-pro",
    ]
    for t in DEFAULT_TEACHERS:
        assert isinstance(t["input_per_mtok"], float) and t["input_per_mtok"] > 0, t
        assert isinstance(t["output_per_mtok"], float) and t["output_per_mtok"] > 0, t


def test_replay_trace_without_key(tmp_path, monkeypatch):
    from composer_replication.teacher_replay import DEFAULT_TEACHERS, replay_trace

    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.hermes/.env either
    monkeypatch.chdir(tmp_path)
    state = {"state_id": "t::0000", "messages": [{"role": "user", "content": "hi"}], "student_action": "x"}
    with pytest.raises(RuntimeError):
        asyncio.run(replay_trace([state], teachers=DEFAULT_TEACHERS[:1], max_total_usd=0.01))
