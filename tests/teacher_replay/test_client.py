"""replay_states / replay_trace against a real loopback server: faults, budget, resume, keys, stop."""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys

import pytest

from composer_replication._io import read_jsonl
from composer_replication.teacher_replay import replay_trace
from composer_replication.teacher_replay.client import RetryPolicy, price_run, replay_states
from composer_replication.teacher_replay.fake_server import Reply

from ._replay_inputs import SECRET, make_states, make_teachers

FAST = RetryPolicy(max_attempts=4, backoff_base_s=0.001, backoff_max_s=0.01)


def run(coro):
    return asyncio.run(coro)


def test_import_does_not_load_httpx():
    code = (
        "import sys, composer_replication as cr, composer_replication.replaysim; "
        "cr.replay_trace, cr.extract_dpo_pairs, cr.DEFAULT_TEACHERS, cr.DPOPair; "
        "print('httpx' in sys.modules, 'data_juicer' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_success_spend_matches_billed_and_key_never_persisted(fake_openrouter, tmp_path, caplog):
    srv = fake_openrouter
    srv.required_key = SECRET
    teachers = make_teachers(srv)
    states = make_states(5)
    bodies = []
    srv.script = lambda info: bodies.append(info.body) or Reply()
    caplog.set_level(logging.DEBUG)
    cache = tmp_path / "calls.jsonl"
    rep = run(  # max_tokens given: the default is the config's (test_replay_defaults_are_written_once)
        replay_states(
            states, teachers, max_total_usd=1.0, api_key=SECRET, cache_path=cache, retry=FAST, max_tokens=1024
        )
    )
    assert [(r["state_id"], r["teacher_slug"]) for r in rep.results] == [
        (s["state_id"], t["slug"]) for s in states for t in teachers
    ]
    assert all(r["error"] is None for r in rep.results)
    assert rep.spent_usd == pytest.approx(srv.billed_usd, rel=1e-9) and srv.billed_usd > 0
    assert sum(r["cost_usd"] for r in rep.results) == pytest.approx(srv.billed_usd, rel=1e-9)
    assert srv.seen_auth == {f"Bearer {SECRET}"}
    # the teacher is asked for the student's action format, with the state's tools, and max_tokens is bounded
    # requests reach the server in any order under concurrency: pick state s0's by its messages
    (body,) = [b for b in bodies if b["messages"][1:] == states[0]["messages"][1:] and b["model"] == "t/a"]
    system = body["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("You are a coding agent.")
    # asked with tools: the session's schemas in the request's ``tools``, not spelled out in the text
    assert "call the tool or tools it should call now" in system["content"]
    assert "[TOOL_USE]" not in system["content"]
    assert [t["function"]["name"] for t in body["tools"]] == ["Read", "Bash", "Edit"]
    assert body["tools"][1]["function"]["parameters"]["required"] == ["command"]
    assert body["max_tokens"] == 1024
    for f in tmp_path.iterdir():
        assert SECRET not in f.read_text()
    assert SECRET not in caplog.text


def test_thirty_percent_faults_every_call_ends_success_or_recorded_error(fake_openrouter, tmp_path):
    srv = fake_openrouter
    teachers = make_teachers(srv)
    states = make_states(20)
    rng = random.Random(7)
    faults = [
        Reply(kind="http_error", status=429, retry_after="0.01"),
        Reply(kind="http_error", status=500),
        Reply(kind="http_error", status=502),
        Reply(kind="http_error", status=503, retry_after="0"),
        Reply(kind="error_200", status=502),
        Reply(kind="malformed"),
        Reply(kind="hang"),
        Reply(kind="http_error", status=400),  # not retryable: becomes a recorded error
    ]
    plan = {}

    def script(info):
        if (info.key, info.n) not in plan:
            plan[(info.key, info.n)] = rng.choice(faults) if rng.random() < 0.3 else Reply(delay_s=0.005)
        return plan[(info.key, info.n)]

    srv.script = script
    cache = tmp_path / "calls.jsonl"
    rep = run(
        replay_states(
            states, teachers, max_total_usd=10.0, cache_path=cache, timeout_s=0.3, retry=FAST, concurrency=8
        )
    )
    assert len(rep.results) == 60
    for r in rep.results:
        assert (r["error"] is None) != (r["response_text"] is None)
    errors = [r for r in rep.results if r["error"]]
    ok = [r for r in rep.results if not r["error"]]
    assert ok and len(ok) + len(errors) == 60
    # every error was recorded in the cache file too
    rows = list(read_jsonl(cache))
    assert {(r["state_id"], r["teacher_slug"]) for r in rows if r["error"]} >= {
        (r["state_id"], r["teacher_slug"]) for r in errors
    }
    # the ledger never under-counts what the server billed, and stays under the cap
    assert srv.billed_usd - 1e-12 <= rep.spent_usd <= 10.0


def test_retry_after_is_honoured(fake_openrouter):
    srv = fake_openrouter
    teachers = make_teachers(srv, slugs=("t/a",))
    times = []

    def script(info):
        import time

        times.append(time.monotonic())
        return Reply(kind="http_error", status=429, retry_after="0.4") if info.n == 1 else Reply()

    srv.script = script
    res = run(replay_trace(make_states(1), teachers, max_total_usd=1.0, retry=FAST))
    assert res[0]["error"] is None and len(times) == 2
    assert times[1] - times[0] >= 0.4  # FAST's own backoff is <= 10 ms


def test_retry_after_pauses_the_whole_teacher(fake_openrouter):
    srv = fake_openrouter
    teachers = make_teachers(srv, slugs=("t/a",))
    seen = []

    def script(info):
        import time

        seen.append((time.monotonic(), info.key[1], info.n))
        if info.key[1].startswith("task s0") and info.n == 1:
            return Reply(kind="http_error", status=429, retry_after="0.5")
        return Reply(delay_s=0.02)

    srv.script = script
    res = run(replay_trace(make_states(6), teachers, max_total_usd=1.0, concurrency=1, retry=FAST))
    assert all(r["error"] is None for r in res)
    t429 = seen[0][0]
    assert seen[0][1].startswith("task s0") and seen[0][2] == 1
    # nothing reached this teacher during the 0.5 s it asked for
    assert all(t - t429 >= 0.5 for t, _, _ in seen[1:])


def test_budget_cap_and_402_halt(fake_openrouter, tmp_path):
    srv = fake_openrouter
    teachers = make_teachers(srv, price=(100.0, 400.0))
    states = make_states(10)
    est = price_run(states, teachers, max_tokens=64)
    cap = est["worst_case_usd"] / 20
    rep = run(replay_states(states, teachers, max_total_usd=cap, max_tokens=64, retry=FAST))
    not_sent = [r for r in rep.results if r["error"] and r["error"].startswith("not sent: budget exhausted")]
    assert not_sent and rep.spent_usd <= cap
    assert srv.billed_usd <= rep.spent_usd + 1e-12
    assert est["expected_usd"] < est["worst_case_usd"]

    srv.script = lambda info: Reply(kind="http_error", status=402)
    rep = run(
        replay_states(make_states(6, prefix="z"), teachers, max_total_usd=10.0, concurrency=1, retry=FAST)
    )
    assert "402" in rep.results[0]["error"]
    assert all(r["error"].startswith("not sent: run halted") for r in rep.results[1:])


def test_rerun_sends_only_missing_calls(fake_openrouter, tmp_path):
    srv = fake_openrouter
    teachers = make_teachers(srv)
    states = make_states(4)
    cache, ledger = tmp_path / "calls.jsonl", tmp_path / "ledger.jsonl"
    srv.script = lambda info: Reply(kind="http_error", status=400) if info.key[0] == "t/c" else Reply()
    rep1 = run(
        replay_states(
            states, teachers, max_total_usd=1.0, cache_path=cache, ledger_path=ledger, retry=FAST, fsync=True
        )
    )
    assert rep1.n_errors == 4 and srv.n_requests == 12
    srv.script = None
    rep2 = run(
        replay_states(states, teachers, max_total_usd=1.0, cache_path=cache, ledger_path=ledger, retry=FAST)
    )
    assert srv.n_requests == 16  # only the 4 failed calls again
    assert rep2.n_cached == 8 and rep2.n_errors == 0
    assert rep2.prior_usd == pytest.approx(
        rep1.spent_usd
    ) and rep2.prior_usd + rep2.spent_usd == pytest.approx(srv.billed_usd)
    assert rep2.results[:2] == rep1.results[:2]


def test_stop_callback_raises_kill_switch(fake_openrouter, tmp_path):
    srv = fake_openrouter
    teachers = make_teachers(srv)
    calls = {"n": 0}

    def stop():
        calls["n"] += 1
        return "STOP file present" if calls["n"] > 3 else None

    with pytest.raises(RuntimeError, match="STOP file") as ei:
        run(replay_states(make_states(10), teachers, max_total_usd=1.0, concurrency=1, stop=stop,
                          cache_path=tmp_path / "c.jsonl"))  # fmt: skip
    assert getattr(ei.value, "exit_code", None) == 3
    assert srv.n_requests == 3 and len(list(read_jsonl(tmp_path / "c.jsonl"))) == 3


def test_real_kill_switch_stops_on_spend(fake_openrouter, tmp_path):
    ks_mod = pytest.importorskip("composer_replication.safety.kill_switch")
    srv = fake_openrouter
    teachers = make_teachers(srv, price=(100.0, 400.0))
    ks = ks_mod.KillSwitch(max_total_usd=0.05)
    with pytest.raises(ks_mod.KillSwitchTriggered) as ei:
        run(replay_states(make_states(20), teachers, max_total_usd=10.0, concurrency=1, stop=ks))
    assert ei.value.exit_code == 3
    per_call = srv.billed_usd / srv.n_requests
    # stopped right after the call that crossed the line, nothing sent after it
    assert srv.billed_usd >= 0.05 > srv.billed_usd - per_call


def test_api_key_lookup(monkeypatch, tmp_path):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    openrouter = [{"slug": "openai/gpt-5", "input_per_mtok": 1.0, "output_per_mtok": 1.0}]
    with pytest.raises(RuntimeError, match="OPENROUTER_API_KEY"):
        run(replay_trace(make_states(1), openrouter))
    from composer_replication.teacher_replay.keys import resolve_api_key

    (tmp_path / ".env").write_text("# comment\nexport OPENROUTER_API_KEY='from-dotenv'\n")
    assert resolve_api_key() == "from-dotenv"
    monkeypatch.setenv("OPENROUTER_API_KEY", "from-env")
    assert resolve_api_key() == "from-env" and resolve_api_key("explicit") == "explicit"


def test_group_fsync_coalesces(tmp_path, monkeypatch):
    import os

    from composer_replication.teacher_replay.durable import GroupFsync

    path = tmp_path / "f.jsonl"
    path.write_text("")
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    g = GroupFsync(path)

    async def writer(i):
        with open(path, "a") as fh:
            fh.write(f"{i}\n")
        g.wrote()
        await g.sync()

    async def main():
        await asyncio.gather(*(writer(i) for i in range(20)))

    run(main())
    g.close()
    assert 1 <= len(calls) < 20 and g._synced == 20


def test_replay_defaults_are_written_once():
    """The spend cap, max_tokens, concurrency and timeout defaults of the library, the config section,
    the API-reference entry points and the CLI are one set of values (config.run)."""
    import argparse
    import inspect

    from composer_replication.cli import replay as replay_cli
    from composer_replication.config import run as cfg
    from composer_replication.replaysim.normalize import replay_and_normalize_trace
    from composer_replication.teacher_replay.client import replay_trace

    section = cfg.ReplayConfig()
    assert (section.max_total_usd, section.max_tokens, section.concurrency) == (5.0, 512, 8)  # the config's
    want = {"max_total_usd": cfg.MAX_TOTAL_USD, "max_tokens": cfg.REPLAY_MAX_TOKENS,
            "concurrency": cfg.REPLAY_CONCURRENCY, "timeout_s": cfg.REPLAY_TIMEOUT_S}  # fmt: skip
    assert (want["max_total_usd"], want["max_tokens"], want["concurrency"]) == (
        section.max_total_usd,
        section.max_tokens,
        section.concurrency,
    )
    for fn in (replay_states, replay_trace):
        params = inspect.signature(fn).parameters
        assert {k: params[k].default for k in want} == want, fn.__name__
    assert inspect.signature(replay_and_normalize_trace).parameters["max_total_usd"].default == 5.0
    assert inspect.signature(price_run).parameters["max_tokens"].default == section.max_tokens
    p = argparse.ArgumentParser()
    replay_cli.add_arguments(p)
    args = p.parse_args(["s.jsonl", "--out", "o", "--max-usd", "2"])
    assert (args.max_total_usd, args.max_tokens, args.concurrency, args.timeout) == (
        2.0, section.max_tokens, section.concurrency, cfg.REPLAY_TIMEOUT_S
    )  # fmt: skip
