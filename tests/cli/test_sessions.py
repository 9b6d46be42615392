"""`composer-replication sessions` and the ingest filters (issue 15 item 4) on the bundled real sessions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from composer_replication.ingestion import ingest_paths, read_sessions

from ..ingestion._ingest_builders import CC, text

DATA = Path(__file__).parents[1] / "data" / "sessions"


def _cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "composer_replication.cli.main", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _json_rows(*args: str) -> list[dict]:
    r = _cli("sessions", *args, "--json")
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()]


def test_sessions_lists_every_session_as_a_table_and_as_json(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    rows = _json_rows(str(DATA), "--store", store)
    by_id = {r["trace_id"]: r for r in rows}
    assert (
        len(rows) == 8
    )  # 12 files: one subagent transcript, two empty sessions, one warmup-free empty rollout
    assert {r["source"] for r in rows} == {"claude_code", "codex"}
    assert [r["start"] for r in rows] == sorted(r["start"] for r in rows)
    big = by_id["marot__spotter__ae4a77f8-aedd-4bc1-888f-c94edc91af04"]
    assert (big["n_turns"], big["n_tool_calls"], big["n_tool_errors"]) == (164, 179, 11)
    assert big["project"] == "/home/USER/projects/spotter-worktrees/spotter-4te"
    assert by_id["iansherr__claude-code-log__326189cf-5676-4237-8cde-1ce80aae4a9f"]["title"].startswith(
        "Claude Code Log"
    )
    table = _cli("sessions", str(DATA), "--store", store)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["source", "project", "start", "turns", "tools", "errors", "title"]
    assert lines[-1] == "8 sessions" and len(lines) == 10
    assert any("spotter-4te" in x and " 164 " in x and " 179 " in x for x in lines)
    everything = _json_rows(str(DATA), "--store", store, "--keep-trivial")
    # The empty rollout too; the two files without a single conversation record have nothing to list.
    assert len(everything) == 9 and by_id.keys() < {r["trace_id"] for r in everything}
    stats = json.loads((tmp_path / "store" / "ingest_stats.json").read_text())["totals"]
    assert stats["n_traces_trivial"] == 2 and stats["skipped_subagent"] > 0


def test_filters_select_sessions_and_are_counted(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    spotter = _json_rows(str(DATA), "--store", store, "--project", "*spotter*")
    assert sorted(r["project"].rsplit("/", 1)[-1] for r in spotter) == ["spotter", "spotter-4te"]
    feb = _json_rows(str(DATA), "--store", store, "--since", "2026-02-01", "--until", "2026-02-12")
    assert sorted(r["start"][:10] for r in feb) == ["2026-02-10", "2026-02-12"]  # --until includes that day
    one = _json_rows(str(DATA), "--store", store, "--session", "55604662")
    assert [r["session_id"] for r in one] == ["55604662-cf2a-4331-851a-ec234028f8ca"]
    out = tmp_path / "out"
    r = _cli("ingest", str(DATA), "--out", str(out), "--project", "*spotter*", "--since", "2026-02-11")
    assert r.returncode == 0, r.stderr
    stats = json.loads((out / "ingest_stats.json").read_text())
    assert stats["totals"]["n_sessions_filtered"] == 11 and stats["filters"]["project"] == ["*spotter*"]
    assert [s["trace_id"] for s in read_sessions(out)] == [
        "marot__spotter__ae4a77f8-aedd-4bc1-888f-c94edc91af04"
    ]
    assert "filtered out" in r.stdout
    bad = _cli("ingest", str(DATA), "--out", str(out), "--since", "last tuesday")
    assert bad.returncode == 1 and "not a date or time" in bad.stderr


def test_warmup_and_empty_sessions_are_skipped_and_counted(tmp_path: Path) -> None:
    warm = CC(session="w")
    warm.user("Warmup")
    warm.assistant([text("I'm ready to help.")])
    empty = CC(session="e")
    empty.user("hello?")
    real = CC(session="r")
    real.user("fix it")
    real.assistant([text("Fixed.")])
    d = tmp_path / "proj"
    for name, cc in (("warm", warm), ("empty", empty), ("real", real)):
        cc.write(d / f"{name}.jsonl")
    res = ingest_paths([d], tmp_path / "out")
    assert res["totals"]["n_traces_trivial"] == 2 and res["totals"]["n_states_emitted"] == 1
    assert [r["trace_id"] for r in read_sessions(tmp_path / "out")] == ["real"]
    kept = ingest_paths([d], tmp_path / "out2", keep_trivial=True)
    assert kept["totals"]["n_traces_trivial"] == 0 and kept["totals"]["n_states_emitted"] == 2
    assert sorted(r["trace_id"] for r in read_sessions(tmp_path / "out2")) == ["empty", "real", "warm"]


def test_a_session_without_a_title_is_named_by_its_first_request(tmp_path: Path) -> None:
    """No summary/title record: the title is the first user request on one line (a slash command by its
    name and arguments), marked ``title_from``; a title from the log is kept as it is."""
    from ..ingestion._ingest_builders import CC, text

    s = CC(session="untitled")
    s.user("  Please fix\n\nthe   flaky test in tests/test_io.py " + "and more words " * 10)
    s.assistant([text("On it.")])
    s.write(tmp_path / "in" / "p" / "untitled.jsonl")
    c = CC(session="cmd")
    c.user("<command-message>review is running…</command-message>\n<command-name>/review</command-name>\n"
           "<command-args>the parser</command-args>")  # fmt: skip
    c.assistant([text("Reviewing.")])
    c.write(tmp_path / "in" / "p" / "cmd.jsonl")
    rows = {r["trace_id"]: r for r in _json_rows(str(tmp_path / "in"), "--store", str(tmp_path / "store"))}
    title = rows["untitled"]["title"]
    assert title.startswith("Please fix the flaky test in tests/test_io.py and more words")
    assert len(title) == 100 and title.endswith("…") and "\n" not in title
    assert rows["untitled"]["title_from"] == "first_request"
    assert rows["cmd"]["title"] == "/review the parser"
    table = _cli("sessions", str(tmp_path / "in"), "--store", str(tmp_path / "store"))
    assert "Please fix the flaky test" in table.stdout and "/review the parser" in table.stdout
    titled = {r["trace_id"]: r for r in _json_rows(str(DATA), "--store", str(tmp_path / "s2"))}
    logged = titled["iansherr__claude-code-log__326189cf-5676-4237-8cde-1ce80aae4a9f"]
    assert logged["title"].startswith("Claude Code Log") and "title_from" not in logged
    assert all(r["title"] for r in titled.values())  # every listed session has a title now
