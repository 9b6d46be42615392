"""What the model saw is kept (issue 15 item 3): context records, subagent runs linked to their call, error
classification that follows the conversation, titles and token usage (item 5). Real files, real ingest."""

from __future__ import annotations

import json
from pathlib import Path

from _ingest_builders import CC, text, tool_use, write_jsonl

from composer_replication.ingestion import ingest_paths, read_examples, read_sessions, read_states

EXPANSION = "Review the diff below. Check naming, tests and error handling, then write a summary."
SKILL_BODY = "Base directory for this skill: /home/u/.claude/skills/pdf\n\n# PDF skill\nUse pdftotext first."


def _rows(out: Path) -> tuple[list[dict], list[dict], dict[str, dict]]:
    return (
        list(read_states(out / "states.jsonl")),
        list(read_examples(out / "traces.jsonl")),
        {r["trace_id"]: r for r in read_sessions(out)},
    )


def test_meta_expansions_skills_and_attachments_are_context_of_their_turn(tmp_path: Path) -> None:
    cc = CC()
    cc._env("attachment", attachment={"type": "hook_additional_context", "content": ["repo uses uv; run uv run pytest"],
                                      "hookName": "SessionStart", "hookEvent": "SessionStart"})  # fmt: skip
    cc._env("attachment", attachment={"type": "hook_success", "content": "", "stdout": "ok", "hookName": "x"})
    cc.user("<command-name>/review</command-name>\n<command-message>review</command-message>")
    cc.user(EXPANSION, isMeta=True)
    cc._env("progress", data={"type": "hook_progress", "hookEvent": "PreToolUse"})
    sk = tool_use("Skill", {"skill": "pdf"})
    cc.assistant([text("Using the skill."), sk])
    cc.tool_result(sk["id"], "Launching skill: pdf")
    cc.user(SKILL_BODY, isMeta=True)
    cc._env("system", subtype="turn_duration", durationMs=1200)
    cc.assistant([text("Done reviewing.")])
    out = tmp_path / "out"
    res = ingest_paths([cc.write(tmp_path / "p" / "s.jsonl")], out)
    t = res["totals"]
    assert t["n_context"] == 3 and t["attachments_left_out"] == {"hook_success": 1}
    assert t["n_display_only"] == 2  # the hook progress and the turn duration
    states, examples, _ = _rows(out)
    assert len(states) == 2
    first_user = states[0]["messages"][1]
    assert first_user["role"] == "user"
    # The hook context, the command and its expansion are one user message, in the order the model got them.
    assert (
        first_user["content"].index("uv run pytest")
        < first_user["content"].index("/review")
        < first_user["content"].index(EXPANSION)
    )
    assert SKILL_BODY in states[1]["messages"][-1]["content"]  # the skill body: context after the result
    result = states[1]["messages"][-2]
    assert result["role"] == "tool" and result["name"] == "Skill" and result["is_error"] is False
    assert result["content"] == "Launching skill: pdf" and result["tool_call_id"] == sk["id"]
    turns = examples[0]["turns"]
    roles = [(x["role"], x.get("kind")) for x in turns]
    assert roles == [
        ("context", "attachment:hook_additional_context"), ("user", None), ("context", "meta"),
        ("assistant", None), ("tool", None), ("context", "skill"), ("assistant", None),
    ]  # fmt: skip
    # The user's own words are only the command: the expansion is not a user turn.
    assert [x["content"] for x in turns if x["role"] == "user"] == [cc.records[2]["message"]["content"]]


def test_sibling_cancellations_are_not_errors_and_a_user_message_clears_the_pending_error(
    tmp_path: Path,
) -> None:
    cc = CC()
    cc.user("check both")
    a, b = tool_use("Bash", {"command": "false"}), tool_use("Bash", {"command": "ls"})
    cc.assistant([a, b])
    cc.tool_result(a["id"], "Exit code 1\nboom", is_error=True)
    cc.tool_result(b["id"], "<tool_use_error>Sibling tool call errored</tool_use_error>", is_error=True)
    cc.assistant([text("The first command failed; retrying.")])
    c = tool_use("Edit", {"file_path": "a.py", "old_string": "x", "new_string": "y"})
    cc.assistant([c])
    cc.tool_result(
        c["id"],
        "The user doesn't want to proceed with this tool use. The tool use was rejected",
        is_error=True,
    )
    cc.user("leave a.py alone, edit b.py instead")
    cc.assistant([text("OK, editing b.py.")])
    out = tmp_path / "out"
    res = ingest_paths([cc.write(tmp_path / "p" / "s.jsonl")], out)
    assert res["totals"]["n_tool_errors"] == 2 and res["totals"]["n_cancelled_tool_calls"] == 1
    assert res["totals"]["error_kinds"] == {"runtime_error": 1, "user_rejected": 1}
    states, examples, _ = _rows(out)
    kinds = {s["student_action"]: s.get("error_kind") for s in states}
    assert kinds["The first command failed; retrying."] == "runtime_error"
    assert kinds["OK, editing b.py."] is None  # the person spoke after the rejection: not an error site
    sites = [e for e in examples if e["kind"] == "error_site"]
    assert len(sites) == 1 and sites[0]["turns"][-1]["content"] == "The first command failed; retrying."
    cancelled = [x for x in sites[0]["turns"] if x["role"] == "tool" and "Sibling" in x["content"]]
    assert cancelled and cancelled[0]["tool_error"] is None


def _parent_with_task(prompt: str, agent: str) -> tuple[CC, dict]:
    cc = CC(session="parent-sess")
    cc.user("explore the repo with a subagent")
    task = tool_use("Task", {"description": "explore", "prompt": prompt, "subagent_type": "Explore"})
    cc.assistant([task])
    return cc, task


def test_subagent_runs_are_linked_to_their_task_call(tmp_path: Path) -> None:
    prompt = "List the modules and what each one does."
    # Oldest layout: the run is inline (isSidechain) in the parent's file.
    cc, task = _parent_with_task(prompt, "a1")
    root = cc.last
    side_u = cc._env(
        "user", message={"role": "user", "content": prompt}, isSidechain=True, agentId="a1", parent=None
    )
    cc.assistant([text("There are three modules.")], isSidechain=True, agentId="a1")
    cc.last = root
    cc.tool_result(task["id"], "There are three modules.", tur={"status": "completed", "agentId": "a1"})
    cc.assistant([text("The subagent found three modules.")])
    assert side_u["isSidechain"]
    proj = tmp_path / "proj"
    cc.write(proj / "parent-sess.jsonl")
    # Newest layout: <session>/subagents/agent-<id>.jsonl with its .meta.json, for a second Task call.
    sub = CC(session="parent-sess")
    sub.user("Read the README.", isSidechain=True, agentId="b2")
    sub.assistant([text("The README says hello.")], isSidechain=True, agentId="b2")
    sub.write(proj / "parent-sess" / "subagents" / "agent-b2.jsonl")
    (proj / "parent-sess" / "subagents" / "agent-b2.meta.json").write_text(
        json.dumps({"toolUseId": "toolu_parent_b2", "agentType": "Explore", "description": "readme"})
    )
    out = tmp_path / "out"
    ingest_paths([proj], out, skip_sidechain=False)
    states, _, sessions = _rows(out)
    inline = sessions["parent-sess@a1"]
    assert inline["parent_tool_use_id"] == task["id"] and inline["agent_id"] == "a1" and inline["sidechain"]
    assert sessions["parent-sess"]["subagents"] == [{"agent_id": "a1", "tool_use_id": task["id"]}]
    filed = sessions["agent-b2"]
    assert filed["parent_tool_use_id"] == "toolu_parent_b2" and filed["agent_id"] == "b2"
    by_trace = {}
    for s in states:
        by_trace.setdefault(s["trace_id"], []).append(s["student_action"])
    assert by_trace["parent-sess@a1"] == ["There are three modules."]
    assert by_trace["agent-b2"] == ["The README says hello."]
    # Never part of the parent's history.
    assert all("three modules." not in m["content"] or m["role"] == "tool" for s in states
               if s["trace_id"] == "parent-sess" for m in s["messages"])  # fmt: skip
    # Skipped by default.
    ingest_paths([proj], tmp_path / "out2")
    assert set(read_sessions_ids(tmp_path / "out2")) == {"parent-sess"}


def read_sessions_ids(out: Path) -> list[str]:
    return [r["trace_id"] for r in read_sessions(out)]


def test_agent_progress_messages_are_read_when_the_subagent_has_no_file(tmp_path: Path) -> None:
    prompt = "Find the latest opentelemetry version."
    cc, task = _parent_with_task(prompt, "p9")
    inner = [
        {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": prompt}]}, "uuid": "i1"},
        {"type": "assistant", "uuid": "i2", "message": {"id": "msg_sub1", "role": "assistant", "model": "m",
         "content": [{"type": "tool_use", "id": "toolu_ws", "name": "WebSearch", "input": {"query": "otel"}}]}},
        {"type": "user", "uuid": "i3", "message": {"role": "user",
         "content": [{"type": "tool_result", "tool_use_id": "toolu_ws", "content": "1.2.3"}]}},
        {"type": "assistant", "uuid": "i4", "message": {"id": "msg_sub2", "role": "assistant", "model": "m",
         "content": [{"type": "text", "text": "The latest is 1.2.3."}]}},
    ]  # fmt: skip
    for m in inner:
        cc._env("progress", data={"type": "agent_progress", "agentId": "p9", "prompt": prompt, "message": m},
                parentToolUseID=task["id"], toolUseID="agent_msg_x")  # fmt: skip
    cc.tool_result(task["id"], "The latest is 1.2.3.", tur={"status": "completed", "agentId": "p9"})
    cc.assistant([text("Version 1.2.3.")])
    proj = tmp_path / "proj"
    cc.write(proj / "parent-sess.jsonl")
    out = tmp_path / "out"
    res = ingest_paths([proj], out, skip_sidechain=False)
    assert res["totals"]["n_subagent_runs"] == 1
    states, _, sessions = _rows(out)
    run = sessions["parent-sess@p9"]
    assert run["from"] == "agent_progress" and run["parent_tool_use_id"] == task["id"]
    assert [s["student_action"] for s in states if s["trace_id"] == "parent-sess@p9"] == [
        '[TOOL_USE] name=WebSearch input={"query": "otel"}',
        "The latest is 1.2.3.",
    ]
    # When the subagent has its own transcript, that file is the run: the progress copy is not used.
    sub = CC(session="parent-sess")
    sub.user(prompt, isSidechain=True, agentId="p9")
    sub.assistant([text("The latest is 1.2.3.")], isSidechain=True, agentId="p9")
    sub.write(proj / "parent-sess" / "subagents" / "agent-p9.jsonl")
    ingest_paths([proj], out, skip_sidechain=False)
    assert sorted(read_sessions_ids(out)) == ["agent-p9", "parent-sess"]
    # Skipped by default: the progress records are display-only then.
    res = ingest_paths([proj], tmp_path / "out2")
    assert read_sessions_ids(tmp_path / "out2") == ["parent-sess"] and res["totals"]["n_display_only"] == 4


def test_titles_and_token_usage(tmp_path: Path) -> None:
    cc = CC()
    cc.user("hello")
    recs = cc.assistant([text("Hi."), tool_use("Bash", {"command": "ls"})], msg_id="msg_1")
    # One response logged twice with growing usage: counted once, the larger.
    recs[0]["message"]["usage"] = {"input_tokens": 10, "output_tokens": 2, "cache_read_input_tokens": 100}
    recs[1]["message"]["usage"] = {"input_tokens": 10, "output_tokens": 30, "cache_read_input_tokens": 100}
    cc._env("ai-title", aiTitle="Greeting the user")
    cc._env("custom-title", customTitle="My greeting session")
    cc.records.append({"type": "summary", "summary": "old summary", "leafUuid": cc.last})
    p = cc.write(tmp_path / "p" / "s.jsonl")
    codex = [
        {"timestamp": "2026-01-01T00:00:00Z", "type": "session_meta", "payload": {"id": "cx1", "cwd": "/w/app", "cli_version": "0.77.0"}},
        {"timestamp": "t", "type": "response_item", "payload": {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions instructions>sandboxed</permissions instructions>"}]}},
        {"timestamp": "t", "type": "response_item", "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/w/app</cwd>\n</environment_context>"}]}},
        {"timestamp": "2026-01-01T00:00:05Z", "type": "response_item", "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run the tests"}]}},
        {"timestamp": "t", "type": "response_item", "payload": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "All green."}]}},
        {"timestamp": "t", "type": "event_msg", "payload": {"type": "token_count", "info": {"total_token_usage": {"input_tokens": 5, "output_tokens": 6, "total_tokens": 11}}}},
        {"timestamp": "t", "type": "event_msg", "payload": {"type": "token_count", "info": {"total_token_usage": {"input_tokens": 50, "output_tokens": 60, "total_tokens": 110}}}},
    ]  # fmt: skip
    q = write_jsonl(tmp_path / "c" / "rollout-2026-01-01T00-00-00-cx1.jsonl", codex)
    out = tmp_path / "out"
    ingest_paths([p, q], out)
    states, examples, sessions = _rows(out)
    s = sessions["s"]
    assert s["title"] == "My greeting session"
    assert s["usage"] == {
        "input_tokens": 10,
        "output_tokens": 30,
        "cache_creation_tokens": 0,
        "cache_read_tokens": 100,
    }
    c = sessions[q.stem]
    assert c["usage"] == {"input_tokens": 50, "output_tokens": 60, "total_tokens": 110}
    assert c["project"] == "/w/app" and c["session_id"] == "cx1" and c["start"] == "2026-01-01T00:00:05Z"
    codex_turns = next(e for e in examples if e["trace_id"] == q.stem)["turns"]
    assert [(x["role"], x.get("kind")) for x in codex_turns] == [
        ("context", "developer"),
        ("context", "environment"),
        ("user", None),
        ("assistant", None),
    ]
    codex_state = next(x for x in states if x["trace_id"] == q.stem)
    assert "<permissions instructions>" in codex_state["messages"][1]["content"]
