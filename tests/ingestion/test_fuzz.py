"""Mutated, reordered and truncated records never crash the parsers; every bad line is counted."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from composer_replication.ingestion import ClaudeCodeIngester, CodexIngester

DATA = Path(__file__).parents[1] / "data" / "sessions"
CC_LINES = (DATA / "claude_code" / "marot__spotter__short.jsonl").read_bytes().splitlines()
CODEX_LINES = [
    line
    for line in (
        DATA
        / "codex"
        / "AcidicSoil__codex-session-view__rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl"
    )
    .read_bytes()
    .splitlines()[:60]
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=6,
)


def _mutate_record(rec: dict, data: st.DataObject) -> dict:
    """Replace, drop or retype random (nested) fields."""
    for _ in range(data.draw(st.integers(0, 4))):
        node = rec
        path = []
        while isinstance(node, dict) and node and data.draw(st.booleans()):
            k = data.draw(st.sampled_from(sorted(node)))
            path.append(k)
            if not isinstance(node[k], (dict, list)):
                break
            node = (
                node[k]
                if isinstance(node[k], dict)
                else (node[k][0] if node[k] and isinstance(node[k][0], dict) else node)
            )
        if isinstance(node, dict) and node:
            k = data.draw(st.sampled_from(sorted(node)))
            if data.draw(st.booleans()):
                del node[k]
            else:
                node[k] = data.draw(json_values)
    return rec


def _fuzz_lines(lines: list[bytes], data: st.DataObject) -> tuple[bytes, int]:
    lines = list(lines)
    perm = data.draw(st.permutations(range(len(lines))))
    if data.draw(st.booleans()):
        lines = [lines[i] for i in perm]
    out, bad = [], 0
    for raw in lines:
        action = data.draw(st.sampled_from(["keep", "mutate", "truncate", "garbage", "array"]))
        if action == "mutate":
            raw = json.dumps(_mutate_record(json.loads(raw), data)).encode()
        elif action == "truncate":
            cut = data.draw(st.integers(1, max(1, len(raw) - 1)))
            raw = raw[:cut]
        elif action == "garbage":
            raw = data.draw(st.binary(min_size=1, max_size=20)).replace(b"\n", b" ")
        elif action == "array":
            raw = b"[1, 2]"
        out.append(raw)
    blob = b"\n".join(out)
    if data.draw(st.booleans()):
        blob += b"\n"
    # Independent count of bad lines: non-empty lines that are not a JSON object after lenient decoding.
    for raw in blob.split(b"\n"):
        if not raw.strip():
            continue
        try:
            ok = isinstance(json.loads(raw.decode("utf-8", "replace")), dict)
        except (ValueError, RecursionError):
            ok = False
        bad += not ok
    return blob, bad


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_claude_code_fuzz_never_raises(tmp_path_factory, data) -> None:
    blob, bad = _fuzz_lines(CC_LINES, data)
    p = tmp_path_factory.mktemp("fz") / "s.jsonl"
    p.write_bytes(blob)
    for kw in ({}, {"skip_sidechain": False, "max_history_tokens": 50}):
        ing = ClaudeCodeIngester(**kw)
        list(ing.ingest(p))
        s = ing.last_stats
        assert s.skipped_truncated_lines == bad
        assert s.n_lines == s.n_records_total + s.skipped_truncated_lines


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_codex_fuzz_never_raises(tmp_path_factory, data) -> None:
    blob, bad = _fuzz_lines(CODEX_LINES, data)
    p = tmp_path_factory.mktemp("fz") / "rollout-x.jsonl"
    p.write_bytes(blob)
    ing = CodexIngester()
    list(ing.ingest(p))
    s = ing.last_stats
    assert s.skipped_truncated_lines == bad
    assert s.n_lines == s.n_records_total + s.skipped_truncated_lines
