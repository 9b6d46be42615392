"""Hostile servers against the spend cap: negative costs, malformed usage, huge bodies, overcharges.

Every case talks to the real loopback server (``FakeOpenRouter``) through the real client and ledger.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from composer_replication._io import DataFileError, read_jsonl
from composer_replication.teacher_replay.client import RetryPolicy, replay_states
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, Reply, sample_states
from composer_replication.teacher_replay.ledger import SpendLedger, ledger_total

FAST = RetryPolicy(max_attempts=3, backoff_base_s=0.001, backoff_max_s=0.01)


def _replay(states, teachers, tmp_path, cap, **kw):
    kw.setdefault("retry", FAST)
    return asyncio.run(
        replay_states(
            states, teachers, max_total_usd=cap, cache_path=tmp_path / "calls.jsonl",
            ledger_path=tmp_path / "ledger.jsonl", progress=False, max_tokens=64, concurrency=4, **kw,
        )
    )  # fmt: skip


def _amounts(path):
    return [r["usd"] for r in read_jsonl(path) if "usd" in r]


@pytest.mark.parametrize("kind", ["http_error", "error_200", "ok"])
def test_negative_cost_never_credits_the_budget(tmp_path, kind):
    # Teacher "evil" reports cost -1000 (in a 500 body, an error body sent with 200, or a 200 answer);
    # teacher "honest" bills its list price. Before the fix the credit let honest be paid 5.9x the cap.
    def script(info):
        return Reply(kind=kind, status=500, cost=-1000.0) if info.model == "evil" else Reply()

    with FakeOpenRouter(script=script) as srv:
        teachers = srv.teachers(("evil", "honest"), price=(200.0, 800.0))
        states = sample_states(30)
        cap = 0.5
        rep = _replay(states, teachers, tmp_path, cap)
        honest_billed = sum(
            r["cost_usd"] for r in rep.results if r["teacher_slug"] == "honest" and r["error"] is None
        )
    amounts = _amounts(tmp_path / "ledger.jsonl")
    assert amounts and min(amounts) >= 0.0  # nothing below zero was ever booked
    assert rep.spent_usd <= cap + 1e-12 and ledger_total(tmp_path / "ledger.jsonl") <= cap + 1e-12
    assert honest_billed <= cap + 1e-12
    evil = [r for r in rep.results if r["teacher_slug"] == "evil"]
    assert all(
        r["error"] and "cost" in r["error"] for r in evil if r["error"] and "not sent" not in r["error"]
    )
    # a rerun starts from what was booked: the bogus credit did not persist in any form
    assert SpendLedger(cap, tmp_path / "ledger.jsonl").spent_usd == pytest.approx(rep.spent_usd)


def test_ledger_refuses_and_rejects_negative_amounts(tmp_path):
    async def settle_negative():
        led = SpendLedger(1.0, tmp_path / "a.jsonl")
        res = await led.reserve("k", 0.1)
        with pytest.raises(ValueError, match="refusing to book"):
            await led.settle(res, -5.0)
        with pytest.raises(ValueError, match="refusing to book"):
            await led.settle(res, float("nan"))
        await led.settle(res, 0.05)
        led.close()

    asyncio.run(settle_negative())
    assert ledger_total(tmp_path / "a.jsonl") == pytest.approx(0.05)

    # a ledger written by the old code: a credit of -1000 at line 2
    bad = tmp_path / "old.jsonl"
    bad.write_text(
        '{"event":"reserve","id":"r-0","key":"k","usd":0.01}\n{"event":"settle","id":"r-0","usd":-1000.0}\n'
    )
    for load in (lambda: SpendLedger(5.0, bad), lambda: ledger_total(bad)):
        with pytest.raises(DataFileError) as e:
            load()
        assert e.value.line == 2 and str(bad) in str(e.value) and "-1000" in str(e.value)


MALFORMED_USAGE = [
    {"prompt_tokens": "lots"},
    {"completion_tokens": -7},
    {"prompt_tokens": 1.5},
    {"prompt_tokens": True},
    {"prompt_tokens": 10**30},
    {"cost": "0.01"},
    {"cost": None, "prompt_tokens": None},
]


@pytest.mark.parametrize("usage", MALFORMED_USAGE, ids=[json.dumps(u) for u in MALFORMED_USAGE])
def test_malformed_usage_is_one_failed_fully_booked_call(tmp_path, usage):
    def script(info):
        return Reply(usage=usage) if info.body["messages"][-1]["content"].startswith("task s0") else Reply()

    with FakeOpenRouter(script=script) as srv:
        teachers = srv.teachers(("t/a",))
        rep = _replay(sample_states(3), teachers, tmp_path, cap=1.0)
        assert srv.counts[("t/a", "task s0: fix the failing test")] == 1  # not retried
    bad, *good = rep.results
    assert bad["error"].startswith("malformed response") and bad["response_text"] is None
    assert all(r["error"] is None for r in good)  # the other calls went on
    reserve = next(r["usd"] for r in read_jsonl(tmp_path / "ledger.jsonl") if r["event"] == "reserve")
    settles = [r for r in read_jsonl(tmp_path / "ledger.jsonl") if r["event"] == "settle"]
    assert any(r["usd"] == pytest.approx(reserve) and "malformed" in r.get("note", "") for r in settles)
    # not cached as an answer: a rerun against a now-honest server sends it again
    with FakeOpenRouter() as srv:
        rep2 = _replay(sample_states(3), srv.teachers(("t/a",)), tmp_path, cap=1.0)
        assert srv.n_requests == 1 and rep2.n_cached == 2 and all(r["error"] is None for r in rep2.results)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_huge_body_is_refused_unread_and_booked(tmp_path, chunked):
    size = 3 << 20  # 3 MiB for max_tokens=64 (the cap is 1 MiB + 64 B/token)
    reply = Reply(huge_bytes=size) if chunked else Reply(text="a" * size)
    with FakeOpenRouter(script=lambda info: reply) as srv:
        rep = _replay(sample_states(1), srv.teachers(("t/a",)), tmp_path, cap=1.0)
        assert srv.n_requests == 1
    (row,) = rep.results
    assert "response body above" in row["error"] and row["response_text"] is None
    assert rep.spent_usd > 0  # booked at its reservation
    assert not any(r.get("error") is None for r in read_jsonl(tmp_path / "calls.jsonl"))


def test_overcharge_is_flagged_as_overrun(tmp_path):
    # A $1000 bill against a $0.05 cap: recorded truthfully, the run halts and says so.
    with FakeOpenRouter(script=lambda info: Reply(cost=1000.0)) as srv:
        rep = _replay(sample_states(5), srv.teachers(("t/a",), price=(1.0, 1.0)), tmp_path, cap=0.05)
        assert srv.n_requests <= 4  # only what was in flight when the first bill came back
    assert rep.overrun and rep.total_usd >= 1000.0
    assert any(r.get("overrun") for r in read_jsonl(tmp_path / "ledger.jsonl"))
    assert sum("provider overcharged" in (r["error"] or "") for r in rep.results) >= 1
