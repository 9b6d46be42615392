"""The stored item's schema (ingestion/schema.py) describes every key the parsers write (issue 34 item 4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from composer_replication.ingestion import ingest_paths
from composer_replication.ingestion.schema import (
    LEGEND,
    ClaudeBlock,
    ClaudeEvent,
    ClaudeItem,
    ClaudeMeta,
    ClaudeProgress,
    CodexItem,
    readable,
)

ROOT = Path(__file__).parents[2]
SESSIONS = [ROOT / "tests" / "data" / "sessions", ROOT / "src" / "composer_replication" / "data"]
TYPED = {
    "claude_code": ClaudeItem,
    "claude_code.b": ClaudeBlock,
    "claude_code.e": ClaudeEvent,
    "claude_code.ap": ClaudeProgress,
    "claude_code.meta": ClaudeMeta,
    "codex": CodexItem,
}


def _keys(item: dict[str, Any], scope: str, seen: dict[str, set[str]]) -> None:
    seen.setdefault(scope, set()).update(item)
    if scope == "claude_code":
        for k in ("b", "e"):
            for x in item.get(k, ()):
                _keys(x, f"claude_code.{k}", seen)
        if "meta" in item:
            _keys(item["meta"], "claude_code.meta", seen)
        if "ap" in item:
            _keys(item["ap"], "claude_code.ap", seen)
            _keys(item["ap"]["it"], "claude_code", seen)


def test_every_stored_key_is_in_the_legend_and_the_typed_definition(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ingest_paths(SESSIONS, out, skip_sidechain=False, keep_trivial=True)
    index = json.loads((out / "ingest_index.json").read_text())
    seen: dict[str, set[str]] = {}
    n = 0
    for e in index["files"].values():
        for line in (out / "parts" / f"{e['part']}.jsonl").read_text().splitlines():
            _keys(json.loads(line), e["format"], seen)
            n += 1
    assert n > 5000 and {"claude_code", "claude_code.b", "claude_code.e", "codex"} <= set(seen)
    for scope, keys in seen.items():
        assert keys <= set(LEGEND[scope]), (scope, keys - set(LEGEND[scope]))
    for scope, td in TYPED.items():  # the legend and the typed definitions name the same keys
        assert set(td.__annotations__) == set(LEGEND[scope]), scope
    # Most of the legend is in use on these real sessions (it is not a list of guesses).
    used = sum(len(v) for v in seen.values())
    assert used >= 0.75 * sum(len(v) for v in LEGEND.values())


def test_readable_renames_every_level() -> None:
    item = {
        "t": "assistant", "u": "u1", "p": "u0", "m": "msg_1", "ts": "2026-01-01T00:00:00Z",
        "b": [{"k": "tool_use", "n": "Bash", "i": {"command": "ls"}, "id": "toolu_1"}],
        "meta": {"sid": "s", "cwd": "/w"},
        "ap": {"a": "ag1", "ptu": "toolu_0", "it": {"t": "user", "e": [{"k": "r", "id": "toolu_9", "t": "x", "f": 1, "ek": "runtime_error"}]}},
    }  # fmt: skip
    r = readable(item, "claude_code")
    assert r["type"] == "assistant" and r["parent_uuid"] == "u0" and r["message_id"] == "msg_1"
    assert r["blocks"] == [{"kind": "tool_use", "tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_call_id": "toolu_1"}]  # fmt: skip
    assert r["session_fields"] == {"session_id": "s", "cwd": "/w"}
    sub = r["agent_progress"]["item"]
    assert r["agent_progress"]["agent_id"] == "ag1" and sub["type"] == "user"
    assert sub["events"][0] == {"kind": "r", "tool_call_id": "toolu_9", "text": "x", "failed": 1, "error_kind": "runtime_error"}  # fmt: skip
    codex = readable({"t": "au", "n": "shell", "i": {"cmd": "ls"}, "id": "c1", "zz": 1}, "codex")
    assert codex == {
        "kind": "au",
        "tool_name": "shell",
        "tool_input": {"cmd": "ls"},
        "tool_call_id": "c1",
        "zz": 1,
    }
