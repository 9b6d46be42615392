"""Every count in ``ingest``'s printed summary agrees with the files written, and none is negative (issue 35).

Property test over folders of good sessions (with tool calls and failed ones), trivial ones (a "Warmup"
exchange, a user message without an answer, only a summary line), bad files (junk text, JSON that is not an
object, a torn last line) and empty files, in one or two project folders, first ingested and then ingested
again (nothing changed: every row copied).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

from _ingest_builders import CC, text, tool_use
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from composer_replication.cli.ingest import _print_table
from composer_replication.ingestion import ingest_paths

DATA = Path(__file__).parents[1] / "data" / "sessions"
REAL = [
    DATA / "claude_code" / "marot__spotter__short.jsonl",
    next((DATA / "codex").glob("AcidicSoil__*.jsonl")),
]
KINDS = (
    "good",
    "good",
    "warmup",
    "no_answer",
    "summary_only",
    "empty",
    "junk",
    "not_objects",
    "torn",
    "real",
)


def _good(n_calls: int, n_errors: int, sid: str) -> bytes:
    s = CC(session=sid)
    s.user("fix the tests")
    for i in range(n_calls):
        tid = f"toolu_{sid}_{i}"
        s.assistant([tool_use("Bash", {"command": f"pytest -k t{i}"}, tid)])
        failed = i < n_errors
        s.tool_result(tid, "Exit code 1\nFAILED" if failed else "1 passed", is_error=failed or None)
    s.assistant([text("done")])
    return b"".join(json.dumps(r).encode() + b"\n" for r in s.records)


def _file(kind: str, k: int, draw_calls: int) -> tuple[str, bytes]:
    sid = f"s{k:02d}"
    if kind == "good":
        return f"{sid}.jsonl", _good(draw_calls, draw_calls // 2, sid)
    if kind == "torn":
        data = _good(draw_calls, 0, sid)
        return f"{sid}.jsonl", data + data.splitlines(keepends=True)[0][:40]
    if kind == "warmup":
        s = CC(session=sid)
        s.user("Warmup")
        s.assistant([text("Ready.")])
        return f"{sid}.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in s.records)
    if kind == "no_answer":
        s = CC(session=sid)
        s.user("hello?")
        return f"{sid}.jsonl", json.dumps(s.records[0]).encode() + b"\n"
    if kind == "summary_only":
        return f"{sid}.jsonl", b'{"type":"summary","summary":"Old work","leafUuid":"x"}\n'
    if kind == "empty":
        return f"{sid}.jsonl", b""
    if kind == "junk":
        return f"{sid}.jsonl", b"this is not json\n\x00\xff garbage\n{{{\n"
    if kind == "not_objects":
        return f"{sid}.jsonl", b'[1, 2]\n"text"\n42\nnull\n'
    src = REAL[k % len(REAL)]
    return f"{sid}-{src.name}", src.read_bytes()


def _summary(result: dict) -> tuple[dict[str, str], list[str]]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _print_table(result)
    rows, extra = {}, []
    for line in buf.getvalue().splitlines():
        m = re.match(r"\s+(\S.*?)\s{2,}(\S.*)$", line)
        if m and not line.startswith("  error kinds") and ":" not in m.group(1):
            rows[m.group(1).strip()] = m.group(2).strip()
        else:
            extra.append(line)
    return rows, extra


def _n(v: str) -> int:
    return int(v.replace(",", ""))


def _lines(path: Path, header: bool) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x]
    return rows[1:] if header else rows


def _check(result: dict, out: Path, n_inputs: int, sidechain_only: int = 0) -> None:
    rows, extra = _summary(result)
    for k, v in rows.items():
        for part in v.split(" / "):
            assert _n(part) >= 0, (k, v)
    sessions = _lines(out / "sessions.jsonl", header=False)
    states = _lines(out / "states.jsonl", header=True)
    examples = _lines(out / "traces.jsonl", header=True)
    assert _n(rows["traces"]) == len(sessions)
    assert _n(rows["states written"]) == len(states) == sum(r["n_states"] for r in sessions)
    assert _n(rows["examples written"]) == len(examples) == sum(r["n_examples"] for r in sessions)
    assert _n(rows["assistant turns"]) == sum(r["n_turns"] for r in sessions)
    assert _n(rows["tool calls"]) == sum(r["n_tool_calls"] for r in sessions)
    assert _n(rows["tool errors"]) == sum(r["n_tool_errors"] for r in sessions)
    kinds = next((x for x in extra if x.startswith("  error kinds: ")), "")
    assert sum(int(p.split("=")[1]) for p in kinds[15:].split(", ") if p) == _n(rows["tool errors"])
    assert all(v > 0 for v in result["totals"]["error_kinds"].values())
    assert _n(rows["files"]) == n_inputs == len(result["files"])
    new, appended, rewritten = map(_n, rows["new / appended / rewritten"].split(" / "))
    unchanged, failed = _n(rows["unchanged (not read)"]), _n(rows["failed"])
    assert new + appended + rewritten + unchanged + failed == n_inputs
    assert sum(f.get("states", 0) for f in result["files"]) == len(states)
    assert sum(f.get("examples", 0) for f in result["files"]) == len(examples)
    # Every file read is kept (it has rows), left out as trivial, or only a subagent transcript.
    with_rows = len({r["file"] for r in sessions})
    assert with_rows + _n(rows["trivial sessions left out"]) + sidechain_only == n_inputs - failed
    assert _n(rows["entries skipped"]) == len(result["skipped"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=7),
    calls=st.lists(st.integers(0, 3), min_size=7, max_size=7),
    two_folders=st.booleans(),
    keep_trivial=st.booleans(),
)
def test_summary_counts_agree_with_the_files_written(
    tmp_path_factory, kinds: list[str], calls: list[int], two_folders: bool, keep_trivial: bool
) -> None:
    root = tmp_path_factory.mktemp("counts")
    for k, kind in enumerate(kinds):
        name, data = _file(kind, k, calls[k])
        folder = root / "in" / (f"-home-u-p{k % 2}" if two_folders else "-home-u-p0")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    out = root / "out"
    first = ingest_paths([root / "in"], out, keep_trivial=keep_trivial)
    _check(first, out, len(kinds))
    again = ingest_paths([root / "in"], out, keep_trivial=keep_trivial)  # nothing changed: rows copied
    assert {f.get("status") for f in again["files"]} <= {"unchanged", None}
    _check(again, out, len(kinds))
    assert again["totals"] == first["totals"]
    shutil.rmtree(root)


def test_the_bundled_sessions_count_as_many_traces_as_sessions_rows(tmp_path: Path) -> None:
    """The case of the issue: 12 files, 8 rows in sessions.jsonl (the summary said 6)."""
    res = ingest_paths([DATA], tmp_path / "out")
    rows, _ = _summary(res)
    n = len((tmp_path / "out" / "sessions.jsonl").read_text().splitlines())
    assert _n(rows["traces"]) == n == 8
    _check(res, tmp_path / "out", 12, sidechain_only=1)  # the agent-a2271d1 transcript
