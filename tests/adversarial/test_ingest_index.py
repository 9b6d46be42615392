"""A hostile or damaged ``ingest_index.json`` (issue 33 bug 4): never a crash, never wrong output, never a
write outside ``--out``, never secrets kept from an older redactor.

Every case edits the index of a real ingest folder, then runs the real ``ingest`` CLI again (a fresh process)
and checks that it exits 0 and writes exactly what a fresh full ingest of the same files writes. Each edit is
tried as it is and "forged" (the entry's checksum recomputed), so the type, range and name checks are tested
on their own, not only through the checksum.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from composer_replication.ingestion import ingest_paths, read_states
from composer_replication.ingestion._index_check import seal

DATA = Path(__file__).parents[1] / "data" / "sessions"
SRC = str(Path(__file__).parents[2] / "src")
SMALL = [
    DATA / "claude_code" / "marot__spotter__short.jsonl",
    DATA / "claude_code" / "iansherr__claude-code-log__326189cf-5676-4237-8cde-1ce80aae4a9f.jsonl",
    next((DATA / "codex").glob("AcidicSoil__*.jsonl")),
]
COMPARED = ("states.jsonl", "traces.jsonl", "sessions.jsonl", "store.json")


def _cli(src: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "composer_replication.cli.main", "ingest", str(src), "--out", str(out),
           "--no-progress", "--jobs", "1"]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def _corpus(root: Path) -> Path:
    for i, f in enumerate(SMALL):
        d = root / f"-home-u-proj{i}"
        d.mkdir(parents=True)
        shutil.copyfile(f, d / f.name)
    return root


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The inputs, an ingest folder of them (to copy and damage) and a fresh full ingest (what must come out)."""
    root = tmp_path_factory.mktemp("index")
    src = _corpus(root / "src")
    ingest_paths([src], root / "template")
    ingest_paths([src], root / "fresh", force=True)
    return {"src": src, "template": root / "template", "fresh": root / "fresh"}


def _assert_fresh(out: Path, fresh: Path) -> None:
    for name in COMPARED:
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name
    mine = sorted(p.name for p in (out / "parts").iterdir())
    assert mine == sorted(p.name for p in (fresh / "parts").iterdir())
    for p in mine:
        assert (out / "parts" / p).read_bytes() == (fresh / "parts" / p).read_bytes(), p


def _first(idx: dict) -> dict:
    return next(e for k, e in idx["files"].items() if k.endswith(SMALL[1].name))


def _shift_ranges(idx: dict) -> None:
    """Point one file's rows at another file's (in bounds, on line boundaries: only the checksum can tell)."""
    a, b = sorted((e for e in idx["files"].values() if e["ranges"]["states.jsonl"][1] > e["ranges"]["states.jsonl"][0]),
                  key=lambda e: e["ranges"]["states.jsonl"][0])[:2]  # fmt: skip
    a["ranges"], b["ranges"] = b["ranges"], a["ranges"]


EDITS: dict[str, Callable[[dict], Any]] = {
    "files_is_a_list": lambda idx: idx.update(files=list(idx["files"].values())),
    "entry_is_a_string": lambda idx: idx["files"].update({k: "x" for k in idx["files"]}),
    "size_is_a_string": lambda idx: _first(idx).update(size=str(_first(idx)["size"])),
    "offset_past_the_end": lambda idx: _first(idx).update(offset=_first(idx)["size"] + 10),
    "ctx_is_a_list": lambda idx: _first(idx).update(ctx=[1, 2]),
    "counter_is_a_string": lambda idx: _first(idx)["lines"].update(n_lines="7"),
    "unknown_counter": lambda idx: _first(idx)["stats"].update(n_bogus=1),
    "ranges_is_a_string": lambda idx: _first(idx).update(ranges="0-10"),
    "range_of_floats": lambda idx: _first(idx)["ranges"].update({"states.jsonl": [1.5, 2.5]}),
    "range_past_the_end": lambda idx: _first(idx)["ranges"].update({"states.jsonl": [200, 10**9]}),
    "range_mid_line": lambda idx: _first(idx)["ranges"].update(
        {"states.jsonl": [x + 3 for x in _first(idx)["ranges"]["states.jsonl"]]}
    ),
    "ranges_swapped": _shift_ranges,
    "folders_is_a_list": lambda idx: idx.update(folders=[]),
    "output_sizes_strings": lambda idx: idx.update(output_sizes={k: str(v) for k, v in idx["output_sizes"].items()}),
    "outputs_is_an_int": lambda idx: idx.update(outputs=5),
    "part_escapes": lambda idx: _first(idx).update(part="../../escaped"),
    "part_of_another_file": lambda idx: _first(idx).update(part=next(iter(idx["files"].values()))["part"]),
}  # fmt: skip


def _damaged(made: dict[str, Path], tmp_path: Path, edit: str, forge: bool) -> Path:
    out = tmp_path / "a" / "b" / "out"
    shutil.copytree(made["template"], out)
    p = out / "ingest_index.json"
    idx = json.loads(p.read_text())
    EDITS[edit](idx)
    if forge and isinstance(idx["files"], dict):
        idx["files"] = {k: seal(e) if isinstance(e, dict) else e for k, e in idx["files"].items()}
    p.write_text(json.dumps(idx))
    return out


@pytest.mark.parametrize("forge", [False, True], ids=["edited", "forged"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_a_bad_index_rebuilds_what_it_describes(made: dict, tmp_path: Path, edit: str, forge: bool) -> None:
    out = _damaged(made, tmp_path, edit, forge)
    res = ingest_paths([made["src"]], out)
    assert not [f for f in res["files"] if "error" in f]
    _assert_fresh(out, made["fresh"])
    # Nothing was written next to (or above) the output folder.
    assert sorted(x.name for x in (tmp_path / "a").iterdir()) == ["b"]
    assert sorted(x.name for x in (tmp_path / "a" / "b").iterdir()) == ["out"]
    assert not list(tmp_path.rglob("escaped*"))
    # And the index written now is trusted as it is: nothing is read again.
    again = ingest_paths([made["src"]], out)
    assert {f["status"] for f in again["files"]} == {"unchanged"}


@pytest.mark.parametrize(
    "edit", ["entry_is_a_string", "range_past_the_end", "part_escapes", "ranges_swapped"]
)
def test_the_cli_on_a_forged_index_exits_0_with_the_right_output(
    made: dict, tmp_path: Path, edit: str
) -> None:
    out = _damaged(made, tmp_path, edit, True)
    r = _cli(made["src"], out)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    _assert_fresh(out, made["fresh"])
    assert not list(tmp_path.rglob("escaped*"))


def test_an_untouched_index_is_trusted_whole(made: dict, tmp_path: Path, monkeypatch) -> None:
    """The checks pass a sound index as it is: a rerun parses nothing and re-assembles nothing (every row,
    single-line ranges included, is copied)."""
    from composer_replication.ingestion import _folder

    out = tmp_path / "out"
    shutil.copytree(made["template"], out)
    calls: list[str] = []
    real = _folder.assemble
    monkeypatch.setattr(
        _folder, "assemble", lambda ing, f, *a, **k: calls.append(f.name) or real(ing, f, *a, **k)
    )
    res = ingest_paths([made["src"]], out)
    assert {f["status"] for f in res["files"]} == {"unchanged"} and calls == []
    _assert_fresh(out, made["fresh"])


def test_stored_text_from_older_redaction_rules_is_redacted_again(tmp_path: Path, monkeypatch) -> None:
    """An ingest folder written by a redactor that missed a shape: the next incremental ingest with the
    current rules leaves no trace of the secret anywhere under --out."""
    from composer_replication.ingestion import _redact_rules, redact

    secret = "hf_" + "Zq3xW9vK2mT7pL4nR8sY1bC6dF0gH5jA"
    src = _corpus(tmp_path / "src")
    session = src / "-home-u-proj0" / SMALL[0].name
    recs = [json.loads(x) for x in session.read_text().splitlines()]
    first_user = next(r for r in recs if r.get("type") == "user" and isinstance(r["message"]["content"], str))
    first_user["message"]["content"] = f"login with {secret} please"
    session.write_text("".join(json.dumps(r) + "\n" for r in recs))

    # The "older" redactor: without the Hugging Face rule, under its own rules id.
    old_rules = [r for r in _redact_rules.RULES if r[0] != "hf_token"]
    monkeypatch.setattr(redact, "_BY_ANCHOR", {})
    for prio, (name, anchors, find) in enumerate(old_rules):
        for a in anchors:
            redact._BY_ANCHOR.setdefault(a, []).append((prio, name, find))
    monkeypatch.setattr(redact, "rules_id", lambda: "older-rules")
    out = tmp_path / "out"
    ingest_paths([src], out)
    stored = b"".join(f.read_bytes() for f in out.rglob("*") if f.is_file())
    assert secret.encode() in stored  # the older rules kept it
    monkeypatch.undo()

    r = _cli(src, out)  # the current rules, incrementally (nothing in the inputs changed)
    assert r.returncode == 0, r.stderr[-2000:]
    stored = b"".join(f.read_bytes() for f in out.rglob("*") if f.is_file())
    assert secret.encode() not in stored and b"[REDACTED:hf_token]" in stored
    assert secret not in json.dumps(list(read_states(out / "states.jsonl")))
    ingest_paths([src], tmp_path / "fresh", force=True)
    _assert_fresh(out, tmp_path / "fresh")


def test_rules_id_follows_the_rule_files(tmp_path: Path) -> None:
    from composer_replication.ingestion import redact

    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("RULES = [1]\n")
    b.write_text("x = 1\n")
    one = redact.files_id([str(a), str(b)])
    a.write_text("RULES = [1, 2]\n")
    assert redact.files_id([str(a), str(b)]) != one
    assert len(redact.rules_id()) == 16 and redact.rules_id() == redact.rules_id()


def test_the_index_keeps_the_working_directory_as_the_items_do(tmp_path: Path) -> None:
    """A secret in the session's cwd is redacted in ingest_index.json, as in the stored items."""
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    proj = tmp_path / "src" / "-home-alice-proj"
    proj.mkdir(parents=True)
    text = SMALL[0].read_text()
    cwd = json.loads(text.splitlines()[0]).get("cwd") or json.loads(text.splitlines()[1])["cwd"]
    (proj / SMALL[0].name).write_text(text.replace(json.dumps(cwd)[1:-1], f"/home/alice/{token}/proj"))
    out = tmp_path / "out"
    r = _cli(tmp_path / "src", out)
    assert r.returncode == 0, r.stderr[-2000:]
    for f in out.rglob("*"):
        if f.is_file():
            assert token.encode() not in f.read_bytes(), f.name
    idx = json.loads((out / "ingest_index.json").read_text())
    (entry,) = idx["files"].values()
    assert entry["cwd"] == "/home/alice/[REDACTED:github_token]/proj"
    # The --project filter matches what is stored.
    again = ingest_paths([tmp_path / "src"], out, project="*alice*")
    assert [f["status"] for f in again["files"]] == ["unchanged"]
