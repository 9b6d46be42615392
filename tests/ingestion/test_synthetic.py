"""Features the real logs lack, written from the format notes: API errors, torn lines, forks, resume,
failing Bash without is_error, subagent layouts, history truncation, thinking, old Codex rollouts."""

from __future__ import annotations

import json
from pathlib import Path

from _ingest_builders import CC, text, thinking, tool_use, write_jsonl

from composer_replication import wire
from composer_replication.ingestion import (
    ClaudeCodeIngester,
    CodexIngester,
    find_session_files,
    ingest_paths,
    read_examples,
    read_states,
)
from composer_replication.ingestion._session import estimate_tokens


def _session() -> CC:
    cc = CC()
    cc.user("fix the failing test")
    a = tool_use("Bash", {"command": "pytest -x"})
    cc.assistant([thinking("run tests first"), text("Running the tests."), a])
    cc.tool_result(
        a["id"],
        "Exit code 1\nFAILED test_x.py::test_a - AssertionError",
        tur={"stdout": "", "stderr": "x", "exitCode": 1},
    )
    b = tool_use("Edit", {"file_path": "a.py", "old_string": "x", "new_string": "y"})
    cc.assistant([b])
    cc.tool_result(
        b["id"], "<tool_use_error>String to replace not found in file.</tool_use_error>", is_error=True
    )
    c = tool_use("Read", {"file_path": "a.py"})
    cc.assistant([text("Let me read it."), c])
    cc.tool_result(c["id"], "1 x = 1")
    cc.assistant([text("Done.")])
    return cc


def test_turns_merge_errors_and_thinking(tmp_path: Path) -> None:
    p = _session().write(tmp_path / "s1.jsonl")
    ing = ClaudeCodeIngester()
    states = list(ing.ingest(p))
    s = ing.last_stats
    assert s.n_assistant_turns == 4 and len(states) == 4
    assert s.n_tool_errors == 2
    assert s.error_kinds == {"runtime_error": 1, "edit_mismatch": 1}
    assert states[0]["student_action"].startswith(
        "[THINKING] run tests first\n\nRunning the tests.\n\n[TOOL_USE] name=Bash"
    )
    # strip_thinking: the history given to teachers has no thinking.
    assert all("[THINKING]" not in m["content"] for st in states for m in st["messages"])
    assert not any(m.get("reasoning_content") for st in states for m in st["messages"])
    last = states[1]["messages"][-1]
    assert last["role"] == "tool" and last["name"] == "Bash" and last["is_error"] is True
    assert states[1]["error_kind"] == "runtime_error"
    kept = list(ClaudeCodeIngester(strip_thinking=False).ingest(p))
    assert any(m.get("reasoning_content") == "run tests first" for m in kept[1]["messages"])
    assert any("[THINKING] run tests first" in m["content"] for m in wire.text_messages(kept[1]["messages"]))
    sites = [e for e in ing.last_examples if e["kind"] == "error_site"]
    assert len(sites) == 2
    for e in sites:
        assert e["turns"][-1]["role"] == "assistant"
        err = [t for t in e["turns"] if t.get("tool_error")]
        assert err[-1]["error_meta"]["error_kind"] in ("runtime_error", "edit_mismatch")
        assert set(e["state_ids"]) <= {st["state_id"] for st in states}


def test_api_errors_torn_and_non_utf8_lines_are_counted(tmp_path: Path) -> None:
    cc = _session()
    cc._env("assistant", isApiErrorMessage=True, message={"id": "msg_err", "role": "assistant", "model": "<synthetic>",
                                                          "content": [text("API Error: 529 overloaded")]})  # fmt: skip
    cc._env("system", subtype="api_error", level="error", content="overloaded")
    cc._env("mystery-new-type", foo=1)
    p = cc.write(tmp_path / "s.jsonl", tail=b'{"type": "user", "bad\xff\xfe": 1}\n{"type":"assistant","mess')
    ing = ClaudeCodeIngester()
    states = list(ing.ingest(p))
    s = ing.last_stats
    assert s.n_api_errors == 2
    assert s.n_non_utf8_lines == 1
    assert s.skipped_truncated_lines == 1  # the torn tail; the non-UTF-8 line still parses (replacement char)
    assert s.n_unknown_types == 1
    assert s.n_lines == s.n_records_total + s.skipped_truncated_lines
    assert all("API Error" not in st["student_action"] for st in states)


def test_fork_keeps_only_the_active_branch(tmp_path: Path) -> None:
    cc = CC()
    root = cc.user("first prompt")
    cc.assistant([text("answer to the abandoned prompt")])
    cc.last = root["uuid"]
    cc.assistant([text("answer on the kept branch")])
    cc.user("edited follow-up")  # child of the kept answer
    cc.assistant([text("final answer")])
    ing = ClaudeCodeIngester()
    states = list(ing.ingest(cc.write(tmp_path / "f.jsonl")))
    actions = [s["student_action"] for s in states]
    assert actions == ["answer on the kept branch", "final answer"]
    assert ing.last_stats.n_off_branch == 1


def test_parallel_tool_calls_on_sibling_branches_are_kept(tmp_path: Path) -> None:
    cc = CC()
    cc.user("look around")
    a, b = tool_use("Bash", {"command": "ls"}), tool_use("Glob", {"pattern": "*.py"})
    first = cc.assistant([a], msg_id="msg_par")[0]
    cc._env("progress", data={"type": "hook_progress"})
    cc.assistant([b], msg_id="msg_par")  # child of the progress record: a sibling branch
    cc.last = first["uuid"]
    cc.tool_result(a["id"], "a.py")
    cc.tool_result(b["id"], "a.py")
    cc.assistant([text("ok")])
    states = list(ClaudeCodeIngester().ingest(cc.write(tmp_path / "p.jsonl")))
    assert len(states) == 2
    assert states[0]["student_action"].count("[TOOL_USE]") == 2
    assert [m["role"] for m in states[1]["messages"][-2:]] == ["tool", "tool"]
    calls = states[1]["messages"][-3]["tool_calls"]
    assert (
        [m["tool_call_id"] for m in states[1]["messages"][-2:]]
        == [c["id"] for c in calls]
        == [a["id"], b["id"]]
    )


def test_resumed_session_duplicates_dropped_across_files(tmp_path: Path) -> None:
    proj = tmp_path / "projects" / "-home-u-repo"
    cc = _session()
    cc.write(proj / "a-first.jsonl")
    cc.records = [dict(r, timestamp="2026-01-02" + r["timestamp"][10:]) for r in cc.records]
    cc.user("continue please")
    cc.assistant([text("continuing")])
    cc.write(proj / "b-resumed.jsonl")
    out = ingest_paths([tmp_path / "projects"], tmp_path / "out")
    t = out["totals"]
    assert t["n_duplicates"] == len(cc.records) - 2
    rows = list(read_states(tmp_path / "out" / "states.jsonl"))
    assert [r["student_action"] for r in rows].count("Done.") == 1
    assert rows[-1]["student_action"] == "continuing"


def test_subagent_layouts(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    main = _session().write(proj / "sess.jsonl")
    sub = CC()
    sub.user("subagent prompt")
    sub.assistant([text("subagent report")])
    for r in sub.records:
        r.update(isSidechain=True, agentId="abc")
    sub.write(proj / "sess" / "subagents" / "agent-abc.jsonl")
    sub.write(proj / "agent-def.jsonl")
    assert find_session_files([proj]) == [main]
    assert len(find_session_files([proj], skip_sidechain=False)) == 3
    ing = ClaudeCodeIngester()
    assert list(ing.ingest(proj / "agent-def.jsonl")) == []
    assert ing.last_stats.skipped_subagent == 2
    kept = list(ClaudeCodeIngester(skip_sidechain=False).ingest(proj / "agent-def.jsonl"))
    assert [s["student_action"] for s in kept] == ["subagent report"]


def test_max_history_tokens_drops_oldest_keeps_system_and_prompt(tmp_path: Path) -> None:
    cc = CC()
    for i in range(30):
        cc.user(f"prompt {i} " + "words " * 50)
        cc.assistant([text(f"reply {i} " + "more " * 50)])
    p = cc.write(tmp_path / "long.jsonl")
    full = list(ClaudeCodeIngester().ingest(p))
    budget = 600
    ing = ClaudeCodeIngester(max_history_tokens=budget)
    cut = list(ing.ingest(p))
    assert len(cut) == len(full) == 30
    assert ing.last_stats.n_history_truncated > 0
    for a, b in zip(full, cut, strict=True):
        assert b["messages"][0] == a["messages"][0]  # system prompt kept
        assert b["messages"][-1] == a["messages"][-1]  # current prompt kept
        assert b["messages"][1:] == a["messages"][len(a["messages"]) - len(b["messages"]) + 1 :]  # a suffix
        total = sum(estimate_tokens(m["content"]) for m in b["messages"])
        assert total <= budget or len(b["messages"]) == 2


def test_version_warning(tmp_path: Path) -> None:
    cc = CC(version="9.9.9")
    cc.user("hi")
    cc.assistant([text("hello")])
    ing = ClaudeCodeIngester()
    list(ing.ingest(cc.write(tmp_path / "v.jsonl")))
    assert ing.last_stats.version_warnings and "9.9.9" in ing.last_stats.version_warnings[0]


def test_codex_pre_058_bare_format(tmp_path: Path) -> None:
    recs = [
        {"id": "0a1b", "timestamp": "2025-05-01T10:00:00Z", "instructions": None, "git": {"branch": "main"}},
        {"record_type": "state"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "gAAA"},
        {"type": "function_call", "name": "shell", "arguments": json.dumps({"command": ["bash", "-lc", "ls nope"]}), "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1",
         "output": json.dumps({"output": "ls: cannot access 'nope': No such file or directory", "metadata": {"exit_code": 2}})},
        {"record_type": "state"},
        {"type": "function_call", "name": "shell", "arguments": "{not json", "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c2", "output": "failed to parse function arguments: expected value"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "There are no files."}]},
    ]  # fmt: skip
    p = write_jsonl(tmp_path / "rollout-2025-05-01T10-00-00-0a1b.jsonl", recs)
    ing = CodexIngester()
    states = list(ing.ingest(p))
    s = ing.last_stats
    assert s.n_assistant_turns == 3 and len(states) == 3
    assert s.n_tool_use_blocks == 2
    # exit code 2, and Codex's own text for arguments that did not parse (no exit code, still a failure)
    assert s.n_tool_errors == 2
    assert s.error_kinds == {"file_not_found": 1, "json_decode": 1}
    assert states[0]["student_action"].startswith("[THINKING] plan\n\n[TOOL_USE] name=shell input=")
    assert states[1]["student_action"] == '[TOOL_USE] name=shell input={"raw_arguments": "{not json"}'
    assert s.n_lines == s.n_records_total + s.skipped_truncated_lines


def test_reader_materialises_exactly_the_in_memory_states(tmp_path: Path) -> None:
    """States and examples read back from the store equal what the ingester builds in memory."""
    cc = CC()
    for i in range(12):
        cc.user(f"prompt {i} " + "w " * 40)
        a = tool_use("Bash", {"command": f"ls {i}"})
        cc.assistant([thinking("hmm"), text(f"reply {i}"), a])
        cc.tool_result(a["id"], "Exit code 1\nboom" if i % 3 == 0 else "ok", is_error=i % 3 == 0)
    p = cc.write(tmp_path / "proj" / "w.jsonl")
    for mht in (None, 120):
        ing = ClaudeCodeIngester(max_history_tokens=mht)
        states = list(ing.ingest(p))
        out = tmp_path / f"out{mht}"
        ingest_paths([p], out, max_history_tokens=mht)
        assert list(read_states(out / "states.jsonl")) == json.loads(json.dumps(states))
        assert list(read_examples(out / "traces.jsonl")) == json.loads(json.dumps(ing.last_examples))
    assert any(s["messages"][1]["content"] != states[0]["messages"][1]["content"] for s in states[1:])


def test_stdlib_json_fallback_gives_the_same_output(tmp_path: Path, monkeypatch) -> None:
    """Without orjson (an optional speed-up) the outputs parse to the same records."""
    from composer_replication.ingestion import _json

    src = Path(__file__).parents[1] / "data" / "sessions" / "claude_code" / "marot__spotter__short.jsonl"
    ingest_paths([src], tmp_path / "fast")
    monkeypatch.setattr(_json, "loads", _json._std_loads)
    monkeypatch.setattr(_json, "dumps", _json._std_dumps)
    monkeypatch.setattr(_json, "JSONDecodeError", json.JSONDecodeError)
    ingest_paths([src], tmp_path / "std")
    for read in (read_states, read_examples):
        name = "states.jsonl" if read is read_states else "traces.jsonl"
        a, b = list(read(tmp_path / "fast" / name)), list(read(tmp_path / "std" / name))
        assert a == b and a
    for part in (tmp_path / "fast" / "parts").glob("*.jsonl"):
        a = [json.loads(x) for x in part.read_text().splitlines()]
        assert a == [json.loads(x) for x in (tmp_path / "std" / "parts" / part.name).read_text().splitlines()]
