"""A stop ends every wait of a replay within about a second, however hostile the server: a huge
`Retry-After` (seconds or an HTTP date), a request that never answers, a long retry backoff; an
in-process teacher's generation stops its worker thread; Ctrl-C during the checks before paying ends
`run` at once. The real CLI (`--stop-file`, SIGINT) against the loopback OpenRouter server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from composer_replication._io import read_jsonl
from composer_replication.safety.kill_switch import KillSwitchTriggered
from composer_replication.teacher_replay.client import RetryPolicy, replay_states
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, Reply, sample_states

HOSTILE_RETRY_AFTER = ["86400", "1e308", "inf", "Wed, 21 Oct 2099 07:28:00 GMT"]
CLI = [sys.executable, "-m", "composer_replication.cli.main"]


def test_retry_after_is_capped_at_the_documented_thirty_seconds():
    policy = RetryPolicy()
    assert policy.retry_after_max_s == 30.0
    assert policy.delay(0, 86400.0) == 30.0 and policy.delay(3, float("inf")) == 30.0
    assert policy.delay(0, 2.0) >= 2.0  # an honest one is honoured


@pytest.mark.parametrize("value", HOSTILE_RETRY_AFTER)
def test_a_hostile_retry_after_waits_the_cap_not_the_header(tmp_path, value):
    """Every call answered 429 with a Retry-After of a day (or more): each wait is the cap, so the call
    fails after its attempts in about attempts x cap, not days."""
    with FakeOpenRouter(script=lambda info: Reply(kind="http_error", status=429, retry_after=value)) as srv:
        t0 = time.monotonic()
        rep = asyncio.run(
            replay_states(sample_states(1), srv.teachers(("t/a",)), max_total_usd=1.0, progress=False,
                          retry=RetryPolicy(max_attempts=3, backoff_base_s=0.001, retry_after_max_s=0.3))
        )  # fmt: skip
        took = time.monotonic() - t0
        assert srv.n_requests == 3
    assert rep.n_errors == 1 and "after 3 attempt(s)" in str(rep.results[0]["error"])
    assert 0.55 <= took < 10  # two waits of the 0.3 s cap


def _write_states(tmp_path: Path, n: int) -> Path:
    states = tmp_path / "states.jsonl"
    states.write_text("".join(json.dumps(s) + "\n" for s in sample_states(n)))
    return states


def _stop_file_run(
    tmp_path: Path, srv: FakeOpenRouter, *extra: str
) -> tuple[subprocess.CompletedProcess, float]:
    """`replay --stop-file` on 4 states; the stop file appears once the server saw a request. Returns the
    finished process and the seconds from the stop file to its exit."""
    teachers = tmp_path / "teachers.json"
    teachers.write_text(json.dumps(srv.teachers(("t/a", "t/b"), price=(1.0, 1.0))))
    stop = tmp_path / "STOP"
    p = subprocess.Popen(
        [*CLI, "replay", str(_write_states(tmp_path, 4)), "--out", str(tmp_path / "out"), "--config", str(teachers),
         "--max-usd", "1", "--no-progress", "--stop-file", str(stop), "--timeout", "600", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while srv.n_requests < 2:
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()
        time.sleep(0.05)
    time.sleep(0.5)  # everyone is waiting now: in a cool-down, a backoff or on the server
    t0 = time.monotonic()
    stop.touch()
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), time.monotonic() - t0


@pytest.mark.parametrize("value", ["86400", "Wed, 21 Oct 2099 07:28:00 GMT"])
def test_stop_file_ends_a_hostile_retry_after_cool_down_within_seconds(tmp_path, value):
    with FakeOpenRouter(script=lambda info: Reply(kind="http_error", status=429, retry_after=value)) as srv:
        p, took = _stop_file_run(tmp_path, srv)
        sent = dict(srv.counts)
    assert p.returncode == 3, p.stderr[-2000:]
    assert "stop file" in p.stderr and "Traceback" not in p.stderr
    assert took < 5, took  # was ~115 s: the cool-down (capped at 120 s) ran out before the stop was seen
    assert len(sent) == 8 and set(sent.values()) == {
        1
    }  # each call tried once; the cool-down held the retries


def test_stop_file_abandons_a_request_that_never_answers_and_books_it(tmp_path):
    with FakeOpenRouter(script=lambda info: Reply(kind="hang")) as srv:
        p, took = _stop_file_run(tmp_path, srv, "--concurrency", "2")
    assert p.returncode == 3 and took < 5, (took, p.stderr[-2000:])
    ledger = list(read_jsonl(tmp_path / "out" / "ledger.jsonl"))
    reserved = {r["id"]: r["usd"] for r in ledger if r["event"] == "reserve"}
    settled = {r["id"]: r for r in ledger if r["event"] == "settle"}
    assert len(reserved) == 2 and set(settled) == set(reserved)  # nothing left open
    for rid, usd in reserved.items():  # it may have been billed: booked in full, never less
        assert settled[rid]["usd"] == pytest.approx(usd) and "stopped in flight" in settled[rid]["note"]
    calls = tmp_path / "out" / "teacher_calls.jsonl"
    assert not calls.exists() or all(r.get("error") is not None for r in read_jsonl(calls))


def test_a_stop_during_a_long_backoff_ends_it(tmp_path):
    """A 503 without Retry-After and a backoff of minutes: the stop ends the sleep, nothing more is sent."""
    t_stop = [float("inf")]

    def stop() -> str | None:
        return "operator stop" if time.monotonic() >= t_stop[0] else None

    def script(info):
        t_stop[0] = min(t_stop[0], time.monotonic() + 0.5)  # stop half a second after the first request
        return Reply(kind="http_error", status=503)

    with FakeOpenRouter(script=script) as srv:
        t0 = time.monotonic()
        with pytest.raises(KillSwitchTriggered, match="operator stop"):
            asyncio.run(
                replay_states(sample_states(3), srv.teachers(("t/a",)), max_total_usd=1.0, progress=False, stop=stop,
                              retry=RetryPolicy(backoff_base_s=120.0, backoff_max_s=120.0), concurrency=1)
            )  # fmt: skip
        took = time.monotonic() - t0
        sent = dict(srv.counts)
    assert len(sent) == 3 and set(sent.values()) == {1}  # each call's first try; no retry after the stop
    assert took < 3, took


def test_a_cancelled_local_generation_stops_its_worker_thread(tiny_model_dir):
    """The in-process teacher generates in a worker thread that the event loop (and the process) waits
    for: cancelling the call stops it at the model's next layer, not at the end of the answer."""
    from composer_replication.teacher_replay.backends.base import ChatRequest
    from composer_replication.teacher_replay.backends.transformers_local import TransformersBackend, preload

    preload(str(tiny_model_dir))
    backend = TransformersBackend({"slug": "local", "model_path": str(tiny_model_dir)})
    model = __import__(
        "composer_replication.teacher_replay.backends.transformers_local", fromlist=["_MODELS"]
    )._MODELS[str(tiny_model_dir)][0]
    forwards: list[float] = []
    hook = model.register_forward_pre_hook(lambda module, args: forwards.append(time.monotonic()))
    req = ChatRequest(model="local", messages=[{"role": "user", "content": "hello"}], max_tokens=4000)

    async def main() -> float:
        task = asyncio.create_task(backend.complete(req))
        while len(forwards) < 3:
            assert not task.done()
            await asyncio.sleep(0.005)
        task.cancel()
        cancelled_at = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        return cancelled_at

    try:
        cancelled_at = asyncio.run(main())  # returns once the worker thread ended (the loop joins it)
        ended = time.monotonic()
    finally:
        hook.remove()
    assert ended - cancelled_at < 5
    assert len([t for t in forwards if t > cancelled_at]) <= 1  # at most the step that saw the flag
    assert len(forwards) < 100  # far from the 4000 tokens asked for
    assert not model._forward_pre_hooks or list(model._forward_pre_hooks.values()) == []  # hooks removed


def test_ctrl_c_during_the_checks_before_paying_ends_run_at_once(tmp_path):
    """`run`'s replay stage first checks the later stages (here data-juicer's dry run, seconds of
    imports that never poll the stop); SIGINT there ends the run at once, nothing sent."""
    (tmp_path / "sessions").mkdir()
    src = Path(__file__).resolve().parents[1] / "data/sessions/claude_code"
    session = src / "d-kimuson__claude-code-viewer__5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl"
    (tmp_path / "sessions" / session.name).write_bytes(session.read_bytes())
    with FakeOpenRouter() as srv:
        cfg = {
            "student": {"name": "tiny"}, "sources": {"paths": ["sessions"], "heldout_fraction": 0.0},
            "replay": {"teachers": srv.teachers(("t/a",)), "max_total_usd": 1.0, "max_tokens": 16},
            "normalize": {"skip_dj": False}, "train": {"logging": {"plot": False, "progress": False}},
            "evaluate": {"sandbox_tasks": False},
        }  # fmt: skip
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
        p = subprocess.Popen(
            [*CLI, "run", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "run"), "--until", "normalize"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert p.stdout is not None
        for line in p.stdout:
            if "[replay] running" in line:
                break
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, said = "", None
        for line in p.stdout:  # the stop message comes when the exception reaches the CLI
            out += line
            if said is None and "kill switch" in line:
                said = time.monotonic() - t0
        p.wait(timeout=120)
        exited = time.monotonic() - t0
        assert srv.n_requests == 0
    assert p.returncode == 3, out[-3000:]
    assert "kill switch: signal: SIGINT" in out and "Traceback" not in out
    # the checks take seconds (data-juicer's imports, the student's trainer config); the stop does not wait
    assert said is not None and said < 3, said
    assert exited < 10, exited  # the rest is the interpreter's exit (freeing torch and friends)
