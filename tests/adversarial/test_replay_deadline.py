"""``timeout`` is one deadline per attempt, even against a server that drip-feeds its answer."""

from __future__ import annotations

import asyncio
import time

import pytest

from composer_replication._io import read_jsonl
from composer_replication.teacher_replay.client import RetryPolicy, replay_states
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, Reply, sample_states


@pytest.mark.parametrize("drip", ["all", "body"], ids=["headers-and-body", "body-only"])
def test_drip_feed_hits_the_deadline_is_booked_and_retried(tmp_path, drip):
    # One byte every 0.4 s: each read arrives well inside httpx's per-read timeout, so without an
    # overall deadline the ~300-byte answer would take minutes per attempt.
    with FakeOpenRouter(script=lambda info: Reply(drip_s=0.4, drip=drip)) as srv:
        t0 = time.monotonic()
        rep = asyncio.run(
            replay_states(
                sample_states(1), srv.teachers(("t/a",)), max_total_usd=1.0, timeout_s=1.0, max_tokens=64,
                cache_path=tmp_path / "calls.jsonl", progress=False,
                retry=RetryPolicy(max_attempts=2, backoff_base_s=0.001, backoff_max_s=0.01),
            )
        )  # fmt: skip
        elapsed = time.monotonic() - t0
        assert srv.n_requests == 2  # retried like any timeout
    assert elapsed < 6.0, elapsed  # two attempts of ~1 s each (plus start-up), not minutes
    (row,) = rep.results
    assert row["error"].startswith("timeout") and "after 2 attempt(s)" in row["error"]
    rows = list(read_jsonl(tmp_path / "calls.ledger.jsonl"))
    reserves = {r["id"]: r["usd"] for r in rows if r["event"] == "reserve"}
    settles = [r for r in rows if r["event"] == "settle"]
    assert len(settles) == 2 and all(r["usd"] == pytest.approx(reserves[r["id"]]) for r in settles)
    assert rep.spent_usd == pytest.approx(sum(reserves.values()))


def test_a_slow_but_honest_server_within_the_deadline_is_fine(tmp_path):
    with FakeOpenRouter(latency_s=0.3) as srv:
        rep = asyncio.run(
            replay_states(
                sample_states(2), srv.teachers(("t/a",)), max_total_usd=1.0, timeout_s=1.0,
                cache_path=tmp_path / "calls.jsonl", progress=False,
            )
        )  # fmt: skip
    assert all(r["error"] is None for r in rep.results)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_timeout_must_be_a_positive_finite_number(bad):
    with pytest.raises(ValueError, match="timeout_s"):
        asyncio.run(replay_states(sample_states(1), [], timeout_s=bad, progress=False))
