"""Property: over random prices, caps and fault schedules, the recorded spend never exceeds the cap
and never under-counts what the server billed."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from composer_replication.teacher_replay.client import RetryPolicy, replay_states
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, Reply

from ._replay_inputs import make_states

FAULTS = [
    Reply(kind="http_error", status=429, retry_after="0"),
    Reply(kind="http_error", status=503),
    Reply(kind="error_200"),
    Reply(kind="malformed"),
    Reply(kind="hang"),
    Reply(cost=None),  # no usage.cost: the ledger prices tokens itself
]


@pytest.fixture(scope="module")
def server():
    srv = FakeOpenRouter().start()
    yield srv
    srv.stop()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prices=st.lists(st.tuples(st.floats(0.0, 200.0), st.floats(0.0, 800.0)), min_size=1, max_size=3),
    cap=st.floats(0.0, 0.5),
    fault_rate=st.floats(0.0, 0.6),
    seed=st.integers(0, 2**16),
    max_tokens=st.integers(1, 400),
)
def test_spend_never_exceeds_cap(server, tmp_path_factory, prices, cap, fault_rate, seed, max_tokens):
    rng = random.Random(seed)
    slugs = [f"p{seed}/{i}" for i in range(len(prices))]
    teachers = []
    for slug, (pin, pout) in zip(slugs, prices):
        server.prices[slug] = (pin, pout)
        teachers.append(
            {"slug": slug, "input_per_mtok": pin, "output_per_mtok": pout, "base_url": server.base_url}
        )
    billed_before = server.billed_usd

    def script(info):
        if rng.random() < fault_rate:
            return rng.choice(FAULTS)
        return Reply(completion_tokens=rng.randint(0, 10_000))  # the server caps it at max_tokens

    server.script = script
    ledger = tmp_path_factory.mktemp("l") / "ledger.jsonl"
    rep = asyncio.run(
        replay_states(
            make_states(6, prefix=f"h{seed}-"), teachers, max_total_usd=cap, max_tokens=max_tokens,
            ledger_path=ledger, timeout_s=0.05, concurrency=4,
            retry=RetryPolicy(max_attempts=3, backoff_base_s=0.0, backoff_max_s=0.0),
        )
    )  # fmt: skip
    billed = server.billed_usd - billed_before
    assert rep.spent_usd <= cap + 1e-12
    assert billed <= rep.spent_usd + 1e-12
    assert len(rep.results) == 6 * len(teachers)
