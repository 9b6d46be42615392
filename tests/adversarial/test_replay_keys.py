"""A server that echoes the request (Authorization header included) must never get the key onto disk,
into a log, into an exception or onto the terminal."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from composer_replication.teacher_replay.client import RetryPolicy, replay_states
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, Reply, sample_states
from composer_replication.teacher_replay.keys import REDACTED_KEY, KeyScrubber

KEY = "sk-or-v1-ECHOED-9f8e7d6c5b4a39281706f5e4d3c2b1a0"
ECHOES = {
    "json_400": Reply(kind="http_error", status=400, echo=True),  # not retried
    "json_500": Reply(kind="http_error", status=500, echo=True),  # retried, then failed
    "json_402": Reply(kind="http_error", status=402, echo=True),  # fatal: halts the run
    "error_200": Reply(kind="error_200", echo=True),
    "html_502": Reply(kind="text_error", status=502, echo=True),  # a proxy's error page
    "completion": Reply(echo=True),  # the answer itself quotes the request
}


def _leaks(text: str) -> list[str]:
    forms = {KEY, KEY[:24], quote(KEY, safe="")}  # a truncation must not leave a usable prefix either
    return [f for f in forms if f in text]


def test_scrubber_forms():
    s = KeyScrubber([KEY, None, ""])
    text = f'Authorization: Bearer {KEY}; json "{KEY}"; url ?key={quote(KEY, safe="")}'
    out = s(text)
    assert KEY not in out and out.count(REDACTED_KEY) == 3 and "Bearer [REDACTED" in out


@pytest.mark.parametrize("name", list(ECHOES))
def test_echoed_key_never_reaches_rows_ledger_or_logs(tmp_path, caplog, name):
    caplog.set_level(logging.DEBUG)
    with FakeOpenRouter(script=lambda info: ECHOES[name]) as srv:
        teachers = srv.teachers(("t/a", "t/b"))
        rep = asyncio.run(
            replay_states(
                sample_states(3), teachers, api_key=KEY, cache_path=tmp_path / "calls.jsonl",
                max_total_usd=1.0, progress=False, retry=RetryPolicy(max_attempts=2, backoff_base_s=0.001),
            )
        )  # fmt: skip
        assert f"Bearer {KEY}" in srv.seen_auth  # the server did get (and echo) the key
    on_disk = "".join(p.read_text() for p in tmp_path.iterdir())
    assert "request: Bearer" in on_disk + repr(rep.results)  # the echo happened and was kept, scrubbed
    assert _leaks(on_disk) == [] and _leaks(repr(rep)) == [] and _leaks(caplog.text) == []


def test_cli_with_echoing_server_keeps_key_off_disk_and_terminal(tmp_path):
    """The real CLI in a subprocess, key from the environment via the teacher's api_key_env."""
    with FakeOpenRouter(script=lambda info: ECHOES["json_500" if info.n == 1 else "completion"]) as srv:
        cfg = tmp_path / "teachers.yaml"
        cfg.write_text(yaml.safe_dump(srv.teachers(("t/a", "t/b"), api_key_env="ECHO_TEST_KEY")))
        states = tmp_path / "states.jsonl"
        states.write_text("".join(__import__("json").dumps(s) + "\n" for s in sample_states(2)))
        out = tmp_path / "out"
        p = subprocess.run(
            [sys.executable, "-m", "composer_replication.cli.main", "replay", str(states), "--out", str(out),
             "--config", str(cfg), "--max-usd", "1", "--timeout", "5"],
            env={**os.environ, "ECHO_TEST_KEY": KEY}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-2000:]
        assert f"Bearer {KEY}" in srv.seen_auth
    files = "".join(f.read_text() for f in Path(out).iterdir() if f.is_file())
    assert "request: Bearer [REDACTED-API-KEY]" in files
    assert _leaks(files) == [] and _leaks(p.stdout + p.stderr) == []
