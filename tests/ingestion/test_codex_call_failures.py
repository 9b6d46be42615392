"""Codex answers a call that failed before anything ran with plain text and no exit code; the Codex
ingester reads those texts as failed tool calls (and ordinary outputs that merely mention them as not)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _ingest_builders import write_jsonl

from composer_replication.ingestion.codex import CodexIngester


def _rollout(tmp_path: Path, output: str) -> Path:
    line = lambda t, p: {"timestamp": "2026-01-01T00:00:00Z", "type": t, "payload": p}  # noqa: E731
    call = {
        "type": "function_call",
        "name": "apply_patch",
        "arguments": json.dumps({"input": "x"}),
        "call_id": "c1",
    }
    recs = [
        line("session_meta", {"id": "s1", "cwd": "/w", "cli_version": "0.58.0"}),
        line("response_item", {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}),
        line("response_item", call),
        line("response_item", {"type": "function_call_output", "call_id": "c1", "output": output}),
        line("response_item", {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}),
    ]  # fmt: skip
    return write_jsonl(tmp_path / "rollout-2026-01-01T00-00-00-s1.jsonl", recs)


@pytest.mark.parametrize(
    ("output", "kind"),
    [
        ("apply_patch verification failed: Failed to find expected lines in /w/a.py:\nx", "edit_mismatch"),
        (
            "patch rejected: writing outside of the project; rejected by user approval settings",
            "user_rejected",
        ),
        ("unsupported call: Bash", "tool_not_found"),
        ("failed to parse function arguments: missing field `command`", "json_decode"),
    ],
)
def test_codex_plain_text_call_failures_are_errors(tmp_path, output, kind):
    ing = CodexIngester()
    states = list(ing.ingest(_rollout(tmp_path, output)))
    assert ing.last_stats.n_tool_errors == 1 and states[1]["error_kind"] == kind


@pytest.mark.parametrize(
    "output",
    [
        json.dumps(
            {"output": "Success. Updated the following files:\nM a.py\n", "metadata": {"exit_code": 0}}
        ),
        json.dumps({"output": "apply_patch verification failed: (a grep hit)", "metadata": {"exit_code": 0}}),
        "Plan updated",
        "the log said: unsupported call: Bash",
    ],
)
def test_outputs_that_only_mention_them_are_not(tmp_path, output):
    ing = CodexIngester()
    list(ing.ingest(_rollout(tmp_path, output)))
    assert ing.last_stats.n_tool_errors == 0
