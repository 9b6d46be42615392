"""Incremental ingest: every kind of change to the inputs gives exactly what a fresh full ingest gives."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from composer_replication.ingestion import ingest_paths, read_examples, read_states

DATA = Path(__file__).parents[1] / "data" / "sessions"
BIG_CC = DATA / "claude_code" / "marot__spotter__ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl"
CODEX = next((DATA / "codex").glob("madshn__*.jsonl"))
SMALL = [
    DATA / "claude_code" / "marot__spotter__short.jsonl",
    DATA / "claude_code" / "iansherr__claude-code-log__326189cf-5676-4237-8cde-1ce80aae4a9f.jsonl",
    next((DATA / "codex").glob("AcidicSoil__*.jsonl")),
]
OUTPUTS = ("states.jsonl", "traces.jsonl", "sessions.jsonl", "store.json")


def _corpus(root: Path) -> Path:
    for i, f in enumerate(SMALL):
        d = root / f"-home-u-proj{i}"
        d.mkdir(parents=True)
        shutil.copyfile(f, d / f.name)
    return root


def _same_as_fresh(src: Path, inc: Path, tmp: Path, **kw) -> dict:
    fresh = tmp / f"fresh{len(list(tmp.glob('fresh*')))}"
    want = ingest_paths([src], fresh, force=True, **kw)
    for name in OUTPUTS:
        assert (inc / name).read_bytes() == (fresh / name).read_bytes(), name
    parts = sorted(p.name for p in (inc / "parts").iterdir())
    assert parts == sorted(p.name for p in (fresh / "parts").iterdir())
    for p in parts:
        assert (inc / "parts" / p).read_bytes() == (fresh / "parts" / p).read_bytes(), p
    return want


def _status(res: dict) -> dict[str, str]:
    return {Path(f["file"]).name: f.get("status", "error") for f in res["files"]}


def test_append_resumes_and_matches_a_fresh_ingest(tmp_path: Path) -> None:
    src = _corpus(tmp_path / "src")
    lines = BIG_CC.read_bytes().splitlines(keepends=True)
    cx_lines = CODEX.read_bytes().splitlines(keepends=True)
    live = src / "-home-u-live" / BIG_CC.name
    live.parent.mkdir()
    cx = src / "codex" / CODEX.name
    cx.parent.mkdir()
    cut = len(lines) // 3
    # The session is being written: the last line is torn.
    live.write_bytes(b"".join(lines[:cut]) + lines[cut][:50])
    cx.write_bytes(b"".join(cx_lines[:200]))
    out = tmp_path / "out"
    first = ingest_paths([src], out)
    assert set(_status(first).values()) == {"new"}
    assert first["totals"]["skipped_truncated_lines"] == 1  # the torn tail
    _same_as_fresh(src, out, tmp_path)

    # The session goes on: the torn line completes and more lines follow (twice).
    for stop in (2 * len(lines) // 3, len(lines)):
        live.write_bytes(b"".join(lines[:stop]))
        with open(cx, "ab") as fh:
            fh.write(b"".join(cx_lines[200:400] if stop < len(lines) else cx_lines[400:]))
        res = ingest_paths([src], out)
        st = _status(res)
        assert st[live.name] == "appended" and st[cx.name] == "appended"
        assert {v for k, v in st.items() if k not in (live.name, cx.name)} == {"unchanged"}
        want = _same_as_fresh(src, out, tmp_path)
        assert res["totals"] == want["totals"]
    # The resumed part holds exactly the items of the whole file: the reader agrees.
    assert [s["state_id"] for s in read_states(out / "states.jsonl")] == [
        s["state_id"] for s in read_states(tmp_path / "fresh2" / "states.jsonl")
    ]


def test_new_deleted_rewritten_touched_and_resumed_sessions(tmp_path: Path) -> None:
    src = _corpus(tmp_path / "src")
    out = tmp_path / "out"
    ingest_paths([src], out)
    # A resumed session: a new file in the same project folder that copies the old one's records.
    proj = src / "-home-u-proj0"
    old = proj / SMALL[0].name
    recs = [json.loads(x) for x in old.read_text().splitlines()]
    for r in recs:
        if "timestamp" in r:
            r["timestamp"] = "2099" + r["timestamp"][4:]
    recs.append({**recs[-1], "uuid": "resumed-extra", "parentUuid": recs[-1].get("uuid")})
    (proj / "zz-resumed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    # A new project, a deleted session, a rewritten one (same size), a touched one.
    d = src / "-home-u-new"
    d.mkdir()
    shutil.copyfile(BIG_CC, d / BIG_CC.name)
    (src / "-home-u-proj2" / SMALL[2].name).unlink()
    f1 = src / "-home-u-proj1" / SMALL[1].name
    data = f1.read_bytes()
    f1.write_bytes(data.replace(b"uv run ty check", b"uv run xx check", 1))
    os.utime(proj / SMALL[0].name, ns=(1, 2))
    res = ingest_paths([src], out)
    st = _status(res)
    assert st["zz-resumed.jsonl"] == "new" and st[BIG_CC.name] == "new" and st[SMALL[1].name] == "rewritten"
    assert st[SMALL[0].name] == "appended"  # only its mtime moved: resumed at its end, nothing new to parse
    assert SMALL[2].name not in st
    assert res["totals"]["n_duplicates"] == sum("uuid" in r for r in recs[:-1])  # every copied record
    _same_as_fresh(src, out, tmp_path)
    # Unchanged inputs: nothing parsed, nothing re-assembled, same bytes.
    before = {n: (out / n).read_bytes() for n in OUTPUTS}
    again = ingest_paths([src], out)
    assert set(_status(again).values()) == {"unchanged"}
    assert {n: (out / n).read_bytes() for n in OUTPUTS} == before
    # The deleted session's part left the store.
    index = json.loads((out / "ingest_index.json").read_text())
    assert not [k for k in index["files"] if k.endswith(SMALL[2].name)]
    assert len(list((out / "parts").glob("*.jsonl"))) == len(index["files"])


def test_a_filtered_run_in_between_does_not_confuse_the_next_one(tmp_path: Path) -> None:
    src = _corpus(tmp_path / "src")
    out = tmp_path / "out"
    ingest_paths([src], out)
    only = ingest_paths([src], out, project="*proj1*")
    assert [Path(f["file"]).name for f in only["files"]] == [SMALL[1].name]
    again = ingest_paths([src], out)
    assert set(_status(again).values()) == {"unchanged"}  # nothing re-parsed: the parts were kept
    _same_as_fresh(src, out, tmp_path)


def test_option_change_reassembles_without_reparsing_and_a_lost_part_is_reparsed(tmp_path: Path) -> None:
    src = _corpus(tmp_path / "src")
    out = tmp_path / "out"
    ingest_paths([src], out)
    res = ingest_paths([src], out, max_history_tokens=2000)
    assert set(_status(res).values()) == {"unchanged"}  # items reused, states re-cut
    _same_as_fresh(src, out, tmp_path, max_history_tokens=2000)
    for p in (out / "parts").glob("*.jsonl"):
        p.unlink()
        break
    res = ingest_paths([src], out, max_history_tokens=2000)
    assert list(_status(res).values()).count("rewritten") == 1
    _same_as_fresh(src, out, tmp_path, max_history_tokens=2000)


@pytest.mark.parametrize("damage", ["index", "outputs"])
def test_inconsistent_previous_outputs_are_not_reused(tmp_path: Path, damage: str) -> None:
    src = _corpus(tmp_path / "src")
    out = tmp_path / "out"
    ingest_paths([src], out)
    if damage == "index":
        (out / "ingest_index.json").write_text("{not json")
    else:  # as if a crash came between the renames of two outputs
        (out / "traces.jsonl").write_bytes((out / "traces.jsonl").read_bytes()[:-10])
    ingest_paths([src], out)
    _same_as_fresh(src, out, tmp_path)
    assert len(list(read_examples(out / "traces.jsonl"))) > 0


def test_worker_processes_give_the_same_bytes(tmp_path: Path) -> None:
    src = _corpus(tmp_path / "src")
    shutil.copytree(DATA / "codex", src / "codex")
    one = ingest_paths([src], tmp_path / "one", jobs=1)
    two = ingest_paths([src], tmp_path / "two", jobs=2)
    for name in OUTPUTS:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert one["totals"] == two["totals"]
    (src / "-home-u-proj0" / SMALL[0].name).write_bytes(b"")  # a change, then an incremental run with workers
    three = ingest_paths([src], tmp_path / "two", jobs=2)
    assert [f["status"] for f in three["files"]].count("unchanged") == len(three["files"]) - 1
    _same_as_fresh(src, tmp_path / "two", tmp_path)


def test_uuid_digests_of_all_uuids_at_once_equal_the_per_uuid_digests() -> None:
    """The one-fromhex path (every uuid a UUID) packs the bytes the per-uuid path packs; near-UUIDs (a dash
    moved, a space, a non-hex digit, other lengths) send the whole part to the per-uuid path."""
    import random
    import struct
    import uuid

    from composer_replication.ingestion import _index as ix

    def per_uuid(items: list[dict]) -> bytes:
        return b"".join(
            struct.pack("<I", i) + ix._uuid_bytes(it["u"])
            for i, it in enumerate(items)
            if it.get("u") is not None
        )

    rng = random.Random(5)
    odd = [lambda u: u[:9] + "-" + u[10:], lambda u: u[:3] + " " + u[4:], lambda u: u[:8] + "g" + u[9:],
           lambda u: u.replace("-", "") + "----", lambda u: u[:35], lambda u: "x" + u, lambda u: u.upper()]  # fmt: skip
    bulk = 0
    for trial in range(400):
        items: list[dict] = []
        for _ in range(rng.randint(0, 40)):
            u = str(uuid.UUID(int=rng.getrandbits(128)))
            r = rng.random()
            items.append({"t": "x"} if r < 0.1 else {"u": None} if r < 0.15 else {"u": u})
        if trial % 2 and items:
            items[rng.randrange(len(items))] = {"u": rng.choice(odd)(str(uuid.uuid4()))}
        uuids = [it["u"] for it in items if it.get("u") is not None]
        bulk += ix._all_uuid_bytes(uuids) is not None
        packed = ix.uuid_digests(items)
        assert packed == per_uuid(items), items
        assert ix.iter_digests(packed) == [
            (int.from_bytes(packed[k : k + 4], "little"), packed[k + 4 : k + 20])
            for k in range(0, len(packed), 20)
        ]
    assert 100 < bulk < 400  # both paths ran
