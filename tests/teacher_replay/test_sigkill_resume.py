"""A replay killed with SIGKILL midway, then rerun, sends no completed call again."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from composer_replication._io import read_jsonl
from composer_replication.teacher_replay.client import RetryPolicy, replay_states
from composer_replication.teacher_replay.ledger import SpendLedger

CHILD = Path(__file__).with_name("_kill_child.py")


def test_sigkill_then_rerun_pays_nothing_twice(fake_openrouter, tmp_path):
    srv = fake_openrouter
    srv.latency_s = 0.05
    srv.prices.update({"k/a": (2.0, 8.0), "k/b": (2.0, 8.0)})
    cache = tmp_path / "calls.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, str(CHILD), srv.base_url, str(cache), "40"], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if cache.exists() and len(cache.read_text().splitlines()) >= 20:
            break
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    done = {(r["teacher_slug"], r["state_id"]) for r in read_jsonl(cache) if r["error"] is None}
    assert 20 <= len(done) < 80, "the child was killed midway"
    before = dict(srv.counts)
    billed_before_rerun = srv.billed_usd
    ledger_path = cache.with_name("calls.ledger.jsonl")
    # a crash leaves the in-flight reservations orphaned: booked in full, never under-counted
    assert SpendLedger(1.0, ledger_path).spent_usd >= billed_before_rerun - 1e-12

    states = [
        {
            "state_id": f"k{i}",
            "messages": [{"role": "user", "content": f"kill task {i}"}],
            "student_action": "x",
        }
        for i in range(40)
    ]
    teachers = [
        {"slug": f"k/{t}", "input_per_mtok": 2.0, "output_per_mtok": 8.0, "base_url": srv.base_url}
        for t in "ab"
    ]
    rep = asyncio.run(replay_states(states, teachers, max_total_usd=1.0, cache_path=cache, concurrency=8,
                                    retry=RetryPolicy(backoff_base_s=0.001)))  # fmt: skip
    assert rep.n_errors == 0 and rep.n_cached == len(done)
    for slug, sid in done:
        key = (slug, f"kill task {sid[1:]}")
        assert srv.counts[key] == before[key], f"{key} was sent again after it completed"
    assert all(srv.counts[(t["slug"], s["messages"][0]["content"])] >= 1 for s in states for t in teachers)
    assert "sk-kill-SECRET" not in cache.read_text() + ledger_path.read_text()
    assert SpendLedger(1.0, ledger_path).spent_usd >= srv.billed_usd - 1e-12
