"""Teachers asked with tools, against a loopback server answering with hostile ``tool_calls``: arguments
that are not JSON, unknown tools, empty names, several and thousands of calls. Each answer is booked,
kept, logged in one line naming the teacher and never counted as a vote; nothing crashes. An endpoint
without tool support is asked in the text format; a request with tools never hits a text request's
cache entry; the key is scrubbed from tool calls."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from composer_replication import wire
from composer_replication.teacher_replay import extract_dpo_pairs
from composer_replication.teacher_replay.client import RetryPolicy, replay_states
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, Reply, tool_call
from composer_replication.teacher_replay.keys import REDACTED_KEY
from composer_replication.teacher_replay.plan import plan_calls
from composer_replication.teacher_replay.prompt import prompt_token_bound

FAST = RetryPolicy(max_attempts=2, backoff_base_s=0.01, backoff_max_s=0.02)
KEY = "sk-or-v1-TOOLCALLS-0123456789abcdef0123"
READ = wire.format_tool_use("Read", {"file_path": "a.py", "limit": 5})


def _state(sid: str = "s0") -> dict:
    """An ingested-shaped state: a call answered by a tool result, the session's tools as names."""
    msgs = [{"role": "system", "content": wire.SYSTEM_PROMPT}, {"role": "user", "content": "fix the test"}]
    msgs.append(wire.assistant_message(wire.format_tool_use("Bash", {"command": "pytest"})))
    msgs.append(wire.tool_message("Bash", "1 failed", True, msgs))
    student = wire.format_tool_use("Bash", {"command": "ls"})
    return {"state_id": sid, "messages": msgs, "student_action": student, "tools": ["Read", "Bash"],
            "source": "claude_code"}  # fmt: skip


@pytest.fixture()
def srv():
    s = FakeOpenRouter().start()
    yield s
    s.stop()


def _run(srv, states, scripts: dict, tmp_path, **kw):
    srv.script = lambda info: scripts[info.model]
    teachers = srv.teachers(tuple(scripts), **kw.pop("spec", {}))
    coro = replay_states(states, teachers, max_total_usd=1.0, api_key=KEY, cache_path=tmp_path / "calls.jsonl",
                         retry=FAST, progress=False, **kw)  # fmt: skip
    return asyncio.run(coro)


def test_the_request_carries_tools_and_the_conversation_as_openai_messages(srv, tmp_path):
    bodies = []
    srv.script = lambda info: (
        bodies.append(info.body) or Reply(tool_calls=[tool_call("Read", {"file_path": "a"})])
    )
    teachers = srv.teachers(("t/a",))
    asyncio.run(replay_states([_state()], teachers, max_total_usd=1.0, progress=False))
    (body,) = bodies
    assert [t["function"]["name"] for t in body["tools"]] == ["Read", "Bash"]
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    call = body["messages"][2]["tool_calls"][0]
    assert call["function"] == {"name": "Bash", "arguments": '{"command": "pytest"}'}
    assert body["messages"][3]["tool_call_id"] == call["id"] and "is_error" not in body["messages"][3]


def test_teachers_agreeing_through_tool_calls_make_a_pair_in_canonical_text(srv, tmp_path):
    scripts = {
        "t/a": Reply(tool_calls=[tool_call("Read", {"file_path": "a.py", "limit": 5})]),
        "t/b": Reply(tool_calls=[tool_call("Read", '{"limit":5,  "file_path":"a.py"}')], text="Reading."),
        "t/c": Reply(text=READ),  # an answer in the text format agrees with the native ones
    }
    states = [_state()]
    rep = _run(srv, states, scripts, tmp_path)
    texts = {r["teacher_slug"]: r["response_text"] for r in rep.results}
    assert texts["t/a"] == READ and texts["t/b"].startswith("Reading.\n\n[TOOL_USE] name=Read input=")
    assert wire.canonical_action(texts["t/b"]) == wire.canonical_action(READ)
    (pair,) = extract_dpo_pairs(states, rep.results)
    assert pair["chosen"] == READ and pair["n_teachers_agreeing"] == 3
    assert pair["rejected"] == states[0]["student_action"]
    assert rep.tool_modes == {"t/a": "native", "t/b": "native", "t/c": "native"}
    assert not rep.malformed_by_teacher


HOSTILE = {
    "t/notjson": ([tool_call("Read", "{not json")], "not valid JSON", "{not json"),
    "t/unknown": ([tool_call("Deploy", {"to": "prod"})], "unknown tool 'Deploy'", "Deploy"),
    "t/empty": ([tool_call("", "{}")], "without a usable name", "_invalid"),
    "t/list": ([tool_call("Read", '["a.py"]')], "must be a JSON object", 'input=["a.py"]'),
    "t/many": ([tool_call("Read", {"file_path": f"f{i}"}, f"c{i}") for i in range(5000)], "5000 tool calls",
               '"f4999"'),
}  # fmt: skip


def test_each_hostile_answer_is_booked_kept_logged_and_never_a_vote(srv, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="composer_replication.teacher_replay.run")
    scripts = {slug: Reply(tool_calls=calls) for slug, (calls, _, _) in HOSTILE.items()}
    scripts["t/several"] = Reply(
        tool_calls=[tool_call("Read", {"file_path": "a"}, "x"), tool_call("Bash", {"command": "ls"}, "y")]
    )
    states = [_state()]
    t0 = time.perf_counter()
    rep = _run(srv, states, scripts, tmp_path)
    assert time.perf_counter() - t0 < 30
    rows = {r["teacher_slug"]: r for r in rep.results}
    assert all(r["error"] is None for r in rep.results)  # answers, not failures: not re-sent (re-paid) later
    assert rep.spent_usd == pytest.approx(srv.billed_usd, rel=1e-9) and all(
        r["cost_usd"] > 0 for r in rows.values()
    )
    assert rep.malformed_by_teacher == {slug: 1 for slug in HOSTILE}
    for slug, (_, why, kept) in HOSTILE.items():
        assert kept in rows[slug]["response_text"]  # nothing lost
        (line,) = [r.getMessage() for r in caplog.records if repr(slug) in r.getMessage()]
        assert why in line and "\n" not in line
    several = rows["t/several"]["response_text"]
    assert wire.canonical_action(several) == (("Read", '{"file_path":"a"}'), ("Bash", '{"command":"ls"}'))
    assert extract_dpo_pairs(states, rep.results, agreement_threshold=1)[0]["chosen"] == several
    # two hostile teachers giving the same malformed answer still make no pair
    twice = [{**rows["t/unknown"], "teacher_slug": s} for s in ("x", "y")]
    assert extract_dpo_pairs(states, twice, agreement_threshold=2) == []
    # the rerun sends nothing: every answer, malformed or not, is in the cache
    n = srv.n_requests
    _run(srv, states, scripts, tmp_path)
    assert srv.n_requests == n


def test_an_endpoint_without_tool_support_is_asked_in_text_and_recorded(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="composer_replication.teacher_replay.run")
    with FakeOpenRouter(tools_supported=False) as srv:
        states = [_state("s0"), _state("s1")]
        srv.script = lambda info: Reply(text=READ)
        teachers = srv.teachers(("t/old",))
        run = lambda: asyncio.run(replay_states(states, teachers, max_total_usd=1.0, api_key=KEY,  # noqa: E731
                                                cache_path=tmp_path / "c.jsonl", retry=FAST, progress=False))  # fmt: skip
        rep = run()
        assert [r["response_text"] for r in rep.results] == [READ, READ] and rep.tool_modes == {
            "t/old": "text"
        }
        assert srv.n_requests <= 4  # at most one refused request per call, then text
        assert (
            sum("refused tools" in r.getMessage() and "'t/old'" in r.getMessage() for r in caplog.records)
            == 1
        )
        rows = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
        assert {r["tool_mode"] for r in rows} == {"text"}
        n = srv.n_requests
        again = run()
        assert srv.n_requests == n and again.tool_modes == {"t/old": "text"}  # the text answers are reused


def test_a_request_with_tools_never_hits_a_text_requests_cache_entry(srv, tmp_path):
    scripts = {"t/a": Reply(text=READ)}
    text_run = _run(srv, [_state()], scripts, tmp_path, spec={"tool_mode": "text"})
    assert text_run.tool_modes == {"t/a": "text"} and srv.n_requests == 1
    native = _run(srv, [_state()], scripts, tmp_path)
    assert srv.n_requests == 2 and native.n_cached == 0 and native.tool_modes == {"t/a": "native"}
    (text_call,) = plan_calls([_state()], srv.teachers(("t/a",), tool_mode="text"), max_tokens=64)
    (native_call,) = plan_calls([_state()], srv.teachers(("t/a",)), max_tokens=64)
    assert native_call.key != text_call.key and native_call.twin.key == text_call.key
    with pytest.raises(ValueError, match="tool_mode"):
        plan_calls([_state()], srv.teachers(("t/a",), tool_mode="xml"), max_tokens=64)


def test_the_prompt_bound_covers_the_tools_and_the_calls():
    call = plan_calls(
        [_state()], [{"slug": "t", "input_per_mtok": 1.0, "output_per_mtok": 1.0}], max_tokens=8
    )[0]
    tools, msgs = call.request.tools, call.request.messages
    assert prompt_token_bound(msgs, tools) >= len(json.dumps(tools).encode()) + prompt_token_bound(msgs)
    no_calls = [{k: v for k, v in m.items() if k != "tool_calls"} for m in msgs]
    assert prompt_token_bound(msgs) > prompt_token_bound(no_calls)


def test_the_key_is_scrubbed_from_tool_calls(srv, tmp_path):
    scripts = {"t/a": Reply(tool_calls=[tool_call("Bash", {"command": f"echo {KEY}"})])}
    rep = _run(srv, [_state()], scripts, tmp_path)
    assert KEY not in rep.results[0]["response_text"] and REDACTED_KEY in rep.results[0]["response_text"]
    for f in tmp_path.iterdir():
        assert KEY not in f.read_text()
