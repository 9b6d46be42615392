"""Every real session log ingests; per-file counts equal an independent derivation from the raw records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from composer_replication.ingestion import ClaudeCodeIngester, CodexIngester

DATA = Path(__file__).parents[1] / "data" / "sessions"
CC_FILES = sorted((DATA / "claude_code").glob("*.jsonl"))
CODEX_FILES = sorted((DATA / "codex").glob("*.jsonl"))


def _raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _expected_cc(path: Path) -> dict[str, int]:
    """Counts straight from the raw JSON, written without the ingester's code paths."""
    recs = _raw(path)
    seen, dups = set(), 0
    uniq = []
    for r in recs:
        if "uuid" in r:
            if r["uuid"] in seen:
                dups += 1
                continue
            seen.add(r["uuid"])
        uniq.append(r)
    chat = [r for r in uniq if r.get("type") in ("user", "assistant")]
    side = [r for r in chat if r.get("isSidechain") is True]
    all_side = len(side) == len(chat) or "agent-" in path.name
    main = [] if all_side else [r for r in chat if r.get("isSidechain") is not True]
    asst = [r for r in main if r["type"] == "assistant" and not r.get("isApiErrorMessage")]
    turns = {r["message"]["id"] for r in asst}
    tool_uses = sum(1 for r in asst for b in r["message"]["content"] if b.get("type") == "tool_use")
    errors = 0
    for r in main:
        c = r["message"].get("content") if r["type"] == "user" else None
        for b in c if isinstance(c, list) else []:
            if b.get("type") != "tool_result":
                continue
            tur = r.get("toolUseResult")
            code = tur.get("exitCode") if isinstance(tur, dict) else None
            body = b["content"] if isinstance(b["content"], str) else ""
            if b.get("is_error") or (code not in (None, 0)) or body.startswith("<tool_use_error>"):
                errors += 1
    return {
        "turns": len(turns),
        "tool_uses": tool_uses,
        "tool_errors": errors,
        "sidechain": len(chat) if all_side else len(side),
        "duplicates": dups,
    }


@pytest.mark.parametrize("path", CC_FILES, ids=lambda p: p.name[:40])
def test_claude_code_counts_match_raw(path: Path) -> None:
    ing = ClaudeCodeIngester()
    states = list(ing.ingest(path))
    s = ing.last_stats
    exp = _expected_cc(path)
    got = {
        "turns": s.n_assistant_turns,
        "tool_uses": s.n_tool_use_blocks,
        "tool_errors": s.n_tool_errors,
        "sidechain": s.skipped_subagent,
        "duplicates": s.n_duplicates,
    }
    assert got == exp
    assert s.n_lines == s.n_records_total + s.skipped_truncated_lines
    ids = [st["state_id"] for st in states]
    assert len(ids) == len(set(ids)) == s.n_states_emitted
    assert all(i.split("::")[0] == path.stem for i in ids)
    # One state per distinct API message: no turn twice (compaction, resume, message-id merging).
    assert s.n_states_emitted + s.n_empty_turns == exp["turns"]
    for st in states:
        assert st["messages"][0]["role"] == "system"
        assert {m["role"] for m in st["messages"]} <= {"system", "user", "assistant", "tool"}
        assert all(isinstance(m["content"], str) for m in st["messages"])


def test_inline_sidechains_do_not_leak_into_parent_history() -> None:
    path = DATA / "claude_code" / "d-kimuson__claude-code-viewer__5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
    side_texts = set()
    for r in _raw(path):
        if r.get("isSidechain") and r.get("type") == "assistant":
            for b in r["message"]["content"]:
                if b.get("type") == "text" and len(b["text"]) > 40:
                    side_texts.add(b["text"][:200])
                if b.get("type") == "tool_use":
                    side_texts.add(json.dumps(b["input"], ensure_ascii=False)[:200])
    assert side_texts
    ing = ClaudeCodeIngester()
    blob = json.dumps(list(ing.ingest(path)), ensure_ascii=False) + json.dumps(
        ing.last_examples, ensure_ascii=False
    )
    assert not [t for t in side_texts if t in blob]
    # With skip_sidechain=False they become traces of their own, never part of the parent's history.
    ing2 = ClaudeCodeIngester(skip_sidechain=False)
    states2 = list(ing2.ingest(path))
    assert ing2.last_stats.n_assistant_turns > ing.last_stats.n_assistant_turns
    parent_n = ing.last_stats.n_states_emitted
    assert [st["messages"] for st in states2[:parent_n]] == [st["messages"] for st in list(ing.ingest(path))]


def test_compaction_starts_a_new_segment_with_the_summary() -> None:
    path = DATA / "claude_code" / "marot__spotter__ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl"
    raw = _raw(path)
    summary = next(r for r in raw if r.get("isCompactSummary"))
    summary_text = summary["message"]["content"]
    summary_text = summary_text if isinstance(summary_text, str) else summary_text[0]["text"]
    boundary_at = next(i for i, r in enumerate(raw) if r.get("subtype") == "compact_boundary")
    before_ids = {
        r["message"]["id"]
        for r in raw[:boundary_at]
        if r.get("type") == "assistant" and not r.get("isSidechain")
    }
    ing = ClaudeCodeIngester()
    states = list(ing.ingest(path))
    assert ing.last_stats.n_compactions == 1
    after = [st for st in states if st["messages"][1]["content"].startswith(summary_text[:200])]
    assert after, "the summary opens the next segment"
    assert len(states) - len(after) == len(before_ids)
    first_before_text = next(st for st in states)["messages"][1]["content"]
    assert all(first_before_text not in m["content"] for st in after for m in st["messages"][2:])


def _expected_codex(path: Path) -> dict[str, int]:
    recs = _raw(path)
    items = [r["payload"] for r in recs if r.get("type") == "response_item"]
    model = {"reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call"}
    turns, in_turn = 0, False
    for it in items:
        is_model = it["type"] in model or (it["type"] == "message" and it.get("role") == "assistant")
        is_user = it["type"].endswith("_output") or (it["type"] == "message" and it.get("role") == "user")
        if is_model and not in_turn:
            turns += 1
        in_turn = (in_turn or is_model) and not is_user
    tool_uses = sum(1 for it in items if it["type"] in model - {"reasoning"})
    errors = 0
    for it in items:
        if it["type"] in ("function_call_output", "custom_tool_call_output"):
            out = it["output"]
            m = re.search(r"\"exit_code\":\s*(-?\d+)", out) or re.search(
                r"Process exited with code (-?\d+)", out
            )
            if m and int(m.group(1)) != 0:
                errors += 1
    return {"turns": turns, "tool_uses": tool_uses, "tool_errors": errors}


@pytest.mark.parametrize("path", CODEX_FILES, ids=lambda p: p.name[:40])
def test_codex_counts_match_raw(path: Path) -> None:
    ing = CodexIngester()
    states = list(ing.ingest(path))
    s = ing.last_stats
    got = {"turns": s.n_assistant_turns, "tool_uses": s.n_tool_use_blocks, "tool_errors": s.n_tool_errors}
    assert got == _expected_codex(path)
    assert s.n_lines == s.n_records_total + s.skipped_truncated_lines
    assert len({st["state_id"] for st in states}) == len(states)
    for st in states:
        assert st["messages"][0]["role"] == "system"
        assert {m["role"] for m in st["messages"]} <= {"system", "user", "assistant", "tool"}


def test_codex_compaction_is_a_segment_boundary() -> None:
    path = (
        DATA
        / "codex"
        / "madshn__localpush__rollout-2026-02-23T12-54-34-019c8a59-e9dd-71f0-9ae3-4079fe9726a9.jsonl"
    )
    ing = CodexIngester()
    states = list(ing.ingest(path))
    assert ing.last_stats.n_compactions == 1
    opened = [st for st in states if st["messages"][1]["content"].startswith("[COMPACTED CONTEXT]")]
    assert 0 < len(opened) < len(states)


def test_subagent_file_never_leaks_into_outputs(tmp_path: Path) -> None:
    """The real subagents/ transcript (agent-a2271d1) of session 29ccd257: skipped, nothing of it in the outputs."""
    from composer_replication.ingestion import ingest_paths

    agent = DATA / "claude_code" / "iansherr__claude-code-log__agent-a2271d1.jsonl"
    texts = {
        b["text"][:200]
        for r in _raw(agent)
        if r.get("type") == "assistant"
        for b in r["message"]["content"]
        if b.get("type") == "text" and len(b["text"]) > 40
    }
    # The final report legitimately reaches the parent as the Task tool's result: exclude what the parent has.
    parent = (
        DATA / "claude_code" / "iansherr__claude-code-log__29ccd257-68b1-427f-ae5f-6524b7cb6f20.jsonl"
    ).read_text()
    texts = {t for t in texts if json.dumps(t, ensure_ascii=False)[1:-1] not in parent}
    assert texts
    res = ingest_paths([DATA / "claude_code"], tmp_path)
    blob = "".join(
        json.dumps(json.loads(line), ensure_ascii=False)
        for f in sorted(tmp_path.rglob("*.jsonl"))
        for line in f.read_text().splitlines()
    )
    assert not [t for t in texts if json.dumps(t, ensure_ascii=False)[1:-1] in blob]
    assert res["totals"]["skipped_subagent"] >= 59
