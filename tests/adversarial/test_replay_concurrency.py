"""Two real processes sharing one ledger file never exceed its cap together; two replays on one
output directory are refused at once, naming the first one's pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composer_replication._io import read_jsonl
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, sample_states
from composer_replication.teacher_replay.ledger import ledger_total

CHILD = r"""
import asyncio, json, os, sys, time
from pathlib import Path
from composer_replication.teacher_replay.client import replay_states
from composer_replication.teacher_replay.fake_server import sample_states
teachers, ledger, cache, prefix, cap, gate = json.loads(sys.argv[1]), *sys.argv[2:]
Path(gate + "." + prefix).touch()            # ready
while not os.path.exists(gate):              # start together
    time.sleep(0.01)
rep = asyncio.run(replay_states(sample_states(50, prefix), teachers, max_total_usd=float(cap),
                                ledger_path=ledger, cache_path=cache, concurrency=4, max_tokens=16,
                                progress=False))
print(json.dumps({"sent": rep.n_sent, "spent": rep.spent_usd, "total": rep.total_usd}))
"""


def test_two_processes_sharing_one_ledger_stay_under_the_cap_together(tmp_path):
    cap = 1.0
    with FakeOpenRouter(latency_s=0.05) as srv:
        # reserved ~$0.08 a call, billed ~$0.02: each process alone would spend ~$1.07 on its 50 calls
        teachers = srv.teachers(("t/a",), price=(100.0, 100.0))
        ledger, gate = tmp_path / "shared.ledger.jsonl", str(tmp_path / "go")
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    json.dumps(teachers),
                    str(ledger),
                    str(tmp_path / f"{p}.jsonl"),
                    p,
                    str(cap),
                    gate,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for p in ("a", "b")
        ]
        deadline = time.monotonic() + 120
        while not all(os.path.exists(f"{gate}.{p}") for p in "ab"):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        Path(gate).touch()
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
        billed = srv.billed_usd
    reports = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert all(r["sent"] > 0 for r in reports)  # both really spent
    assert billed <= cap + 1e-9 and ledger_total(ledger) <= cap + 1e-9
    settled = sum(r["usd"] for r in read_jsonl(ledger) if r["event"] == "settle")
    assert sum(r["spent"] for r in reports) == pytest.approx(settled)
    assert sum(r["spent"] for r in reports) > 0.8 * cap  # the cap was the limit, not a lack of work
    runs = [r["id"].split("-")[0] for r in read_jsonl(ledger) if r["event"] == "reserve"]
    switches = sum(a != b for a, b in zip(runs, runs[1:]))
    assert switches >= 2, runs  # the two processes' reservations interleaved: they really overlapped


def test_second_replay_on_the_same_out_dir_is_refused_naming_the_pid(tmp_path):
    states = tmp_path / "states.jsonl"
    states.write_text("".join(json.dumps(s) + "\n" for s in sample_states(3)))
    with FakeOpenRouter(latency_s=3.0) as srv:
        # Each process sends its own key, so the server tells their requests apart (the first keeps calling
        # while the second starts, however slow this machine is).
        teachers = tmp_path / "teachers.json"
        teachers.write_text(
            json.dumps(srv.teachers(("t/a",), price=(1.0, 1.0), api_key_env="CR_TEST_RUN_KEY"))
        )
        args = [sys.executable, "-m", "composer_replication.cli.main", "replay", str(states), "--out",
                str(tmp_path / "out"), "--config", str(teachers), "--max-usd", "1",
                "--concurrency", "1", "--no-progress"]  # fmt: skip
        first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "CR_TEST_RUN_KEY": "first-run"})  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while srv.n_requests == 0:  # the first one holds the directory and is mid-call
                assert time.monotonic() < deadline and first.poll() is None, first.communicate()
                time.sleep(0.05)
            t0 = time.monotonic()
            second = subprocess.run(args, capture_output=True, text=True, timeout=60,
                                    env={**os.environ, "CR_TEST_RUN_KEY": "second-run"})  # fmt: skip
            assert second.returncode == 1 and time.monotonic() - t0 < 20
            assert f"in use by pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
            assert srv.seen_auth == {"Bearer first-run"}  # the second sent nothing
        finally:
            first.kill()
            first.communicate()
