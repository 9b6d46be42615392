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


@pytest.mark.parametrize("key", ["EMPTY", "ollama", "a", "sk-no-key-required"])
def test_a_placeholder_key_is_not_cut_out_of_teacher_answers(tmp_path, key):
    """Local servers take any key (`EMPTY` for vLLM, `ollama`); it is no secret, and scrubbing it would
    cut ordinary words out of the answers (every letter `a` of them, for the key `a`)."""
    answer = '[TOOL_USE] name=Bash input={"command": "ollama run llama3 && echo EMPTY > a.txt"}'
    with FakeOpenRouter(script=lambda info: Reply(text=answer, echo=True)) as srv:
        rep = asyncio.run(
            replay_states(sample_states(2), srv.teachers(("t/a",)), api_key=key, max_total_usd=1.0,
                          cache_path=tmp_path / "calls.jsonl", progress=False)
        )  # fmt: skip
        assert srv.seen_auth == {f"Bearer {key}"}
    assert rep.n_errors == 0
    for row in rep.results:
        assert row["response_text"].startswith(answer + " (request: Bearer " + key + " ")
        assert REDACTED_KEY not in row["response_text"]


def test_which_keys_could_be_secrets():
    from composer_replication.teacher_replay.keys import could_be_secret

    for placeholder in ("EMPTY", "ollama", "a", "token-abc123", "sk-no-key-required", "x" * 64, "ab" * 20):
        assert not could_be_secret(placeholder), placeholder
        assert KeyScrubber([placeholder])(f"say {placeholder}") == f"say {placeholder}"
    for secret in (
        KEY,
        "sk-or-v1-" + "0123456789abcdef" * 4,
        "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3",
        "0123456789abcdef",
    ):
        assert could_be_secret(secret), secret
        assert KeyScrubber([secret])(f"say {secret}") == f"say {REDACTED_KEY}"
