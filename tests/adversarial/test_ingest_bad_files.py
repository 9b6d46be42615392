"""One bad file never kills an ingest (issue 14 item 9), with real files on disk.

Each hostile input sits in a folder next to good sessions: the good sessions are ingested exactly as without
it, and the bad one is counted and named (file and line numbers) in the summary and in ``ingest_stats.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from composer_replication.ingestion import ClaudeCodeIngester, CodexIngester, ingest_paths, read_states

DATA = Path(__file__).parents[1] / "data" / "sessions"
GOOD = DATA / "claude_code" / "marot__spotter__short.jsonl"
GOOD_CODEX = next((DATA / "codex").glob("AcidicSoil__*.jsonl"))
SRC = str(Path(__file__).parents[2] / "src")


def _cli(*args: str, drop_dac: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "composer_replication.cli.main", "ingest", *args, "--no-progress"]
    if drop_dac and os.geteuid() == 0:
        # root reads any file: drop the capabilities that bypass permission bits, so chmod 000 means unreadable
        cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *cmd]
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _good_folder(root: Path) -> Path:
    proj = root / "proj"
    proj.mkdir(parents=True)
    shutil.copyfile(GOOD, proj / GOOD.name)
    shutil.copyfile(GOOD_CODEX, proj / GOOD_CODEX.name)
    return proj


def _baseline(tmp_path: Path) -> dict:
    base = ingest_paths([_good_folder(tmp_path / "base")], tmp_path / "base_out")
    return base


def _rec(**kw) -> str:
    env = {"parentUuid": None, "isSidechain": False, "sessionId": "bad", "version": "2.1.38",
           "timestamp": "2026-01-01T00:00:00.000Z"}  # fmt: skip
    return json.dumps({**env, **kw})


def _session_lines() -> list[str]:
    """A small valid Claude Code session: prompt, tool call, result, answer (uuids chained)."""
    return [
        _rec(type="user", uuid="b1", message={"role": "user", "content": "list files"}),
        _rec(type="assistant", uuid="b2", parentUuid="b1",
             message={"id": "m1", "role": "assistant", "model": "x",
                      "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]}),
        _rec(type="user", uuid="b3", parentUuid="b2",
             message={"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]}),
        _rec(type="assistant", uuid="b4", parentUuid="b3",
             message={"id": "m2", "role": "assistant", "model": "x", "content": [{"type": "text", "text": "done"}]}),
    ]  # fmt: skip


def _good_rows(out: Path, name: str) -> list[dict]:
    return [s for s in read_states(out / "states.jsonl") if s["trace_id"] == name]


def _assert_good_ingested(stats: dict, out: Path, base: dict, base_out: Path) -> None:
    files = {Path(f["file"]).name: f for f in stats["files"]}
    for good in (GOOD, GOOD_CODEX):
        assert files[good.name]["states"] > 0 and "error" not in files[good.name]
        assert _good_rows(out, good.stem) == _good_rows(base_out, good.stem)


@pytest.mark.parametrize(
    ("case", "line", "reason"),
    [
        ("surrogate", 2, "lone surrogate"),
        ("deep_input", 2, "nested deeper than"),
        ("deep_result", 3, "unusable user record"),
        ("bigint", 2, "integer too long"),
        ("codex_deep_args", 3, "unusable response_item/function_call record"),
    ],
)
def test_hostile_line_is_named_and_the_rest_is_ingested(
    tmp_path: Path, case: str, line: int, reason: str
) -> None:
    base = _baseline(tmp_path)
    proj = _good_folder(tmp_path / "run")
    lines = _session_lines()
    if case == "surrogate":
        lines[1] = lines[1].replace('"ls"', '"ls \\ud800 \\udfff"')
    elif case == "deep_input":
        deep = "1"
        for _ in range(300):
            deep = '{"a": [' + deep + "]}"
        lines[1] = lines[1].replace('{"command": "ls"}', deep)
    elif case == "deep_result":  # orjson parses any depth; the encoders downstream do not
        lines[2] = lines[2].replace('"content": "a.py"', '"content": ' + '{"a": ' * 5000 + "1" + "}" * 5000)
    elif case == "bigint":
        lines[1] = lines[1].replace('"ls"', "9" * 5000)
    name = "bad.jsonl"
    if case == "codex_deep_args":
        name = "rollout-bad.jsonl"
        args = json.dumps("[" * 400 + "]" * 400)
        lines = [
            json.dumps({"timestamp": "t", "type": "session_meta", "payload": {"id": "x", "cli_version": "0.50.0"}}),
            json.dumps({"timestamp": "t", "type": "response_item",
                        "payload": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}}),
            '{"timestamp": "t", "type": "response_item", "payload": {"type": "function_call", "name": "shell", '
            f'"arguments": {args}, "call_id": "c1"}}}}',
            json.dumps({"timestamp": "t", "type": "response_item",
                        "payload": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}}),
        ]  # fmt: skip
    (proj / name).write_text("\n".join(lines) + "\n")
    r = _cli(str(proj), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    stats = json.loads((tmp_path / "out" / "ingest_stats.json").read_text())
    _assert_good_ingested(stats, tmp_path / "out", base, tmp_path / "base_out")
    bad = next(f for f in stats["files"] if f["file"].endswith(name))
    assert bad["first_bad_lines"][0]["line"] == line and reason in bad["first_bad_lines"][0]["reason"]
    assert f"{name}: line {line} (" in r.stdout  # named in the printed summary
    rows = list(read_states(tmp_path / "out" / "states.jsonl"))
    mine = [x for x in rows if x["trace_id"] == Path(name).stem]
    if case in ("surrogate", "bigint"):  # repaired, not dropped: the call is in the next state's history
        shown = [json.dumps(m, ensure_ascii=False) for x in mine for m in x["messages"]]  # calls included
        assert mine and any("\ufffd" in m or "9" * 100 in m for m in shown)
        assert ("\ufffd" in mine[0]["student_action"]) == (case == "surrogate")
    else:  # the unusable record is dropped; the rest of that session is still ingested
        want = {"deep_input": ["done"], "codex_deep_args": ["ok"]}.get(case)
        got = [x["student_action"] for x in mine]
        assert got == want if want else got[-1] == "done" and got[0].startswith("[TOOL_USE] name=Bash")


def test_unreadable_and_vanished_files_are_per_file_errors(tmp_path: Path, monkeypatch) -> None:
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to bite")
    base = _baseline(tmp_path)
    proj = _good_folder(tmp_path / "run")
    locked = proj / "locked.jsonl"
    locked.write_text("\n".join(_session_lines()) + "\n")
    locked.chmod(0)
    sub = proj / "private"
    sub.mkdir()
    (sub / "x.jsonl").write_text("\n".join(_session_lines()) + "\n")
    sub.chmod(0)
    try:
        r = _cli(str(proj), "--out", str(tmp_path / "out"), drop_dac=True)
    finally:
        locked.chmod(0o644)
        sub.chmod(0o755)
    assert r.returncode == 0, r.stderr
    stats = json.loads((tmp_path / "out" / "ingest_stats.json").read_text())
    _assert_good_ingested(stats, tmp_path / "out", base, tmp_path / "base_out")
    err = next(f for f in stats["files"] if f["file"].endswith("locked.jsonl"))
    assert "permission denied" in err["error"]
    assert stats["totals"]["n_file_errors"] == 1
    assert stats["skipped"] == [{"path": str(sub), "reason": "folder not readable: permission denied"}]
    assert "locked.jsonl: permission denied" in r.stdout and f"skipped: {sub}" in r.stdout

    # A file deleted between the listing and the read: the real listing, then the file goes away.
    import composer_replication.ingestion._ingest as ing

    real_scan = ing.scan_session_files
    doomed = proj / "doomed.jsonl"
    doomed.write_text("\n".join(_session_lines()) + "\n")

    def scan_then_delete(*a, **kw):
        found = real_scan(*a, **kw)
        doomed.unlink()
        return found

    monkeypatch.setattr(ing, "scan_session_files", scan_then_delete)
    shutil.rmtree(sub)
    locked.unlink()
    res = ingest_paths([proj], tmp_path / "out2")
    _assert_good_ingested(res, tmp_path / "out2", base, tmp_path / "base_out")
    gone = next(f for f in res["files"] if f["file"].endswith("doomed.jsonl"))
    assert "deleted or moved after it was listed" in gone["error"] and res["totals"]["n_file_errors"] == 1


def test_fifos_and_bad_symlinks_are_counted_and_named(tmp_path: Path) -> None:
    base = _baseline(tmp_path)
    proj = _good_folder(tmp_path / "run")
    fifo = proj / "pipe.jsonl"
    os.mkfifo(fifo)
    (proj / "dangling.jsonl").symlink_to(proj / "nowhere.jsonl")
    (proj / "loop_a.jsonl").symlink_to(proj / "loop_b.jsonl")
    (proj / "loop_b.jsonl").symlink_to(proj / "loop_a.jsonl")
    (proj / "nested").mkdir()
    (proj / "nested" / "up").symlink_to(proj)  # a folder loop: must not be walked forever
    (proj / "nested" / "link.jsonl").symlink_to(proj / GOOD.name)  # a good file symlink is followed
    r = _cli(str(proj), "--out", str(tmp_path / "out"), timeout=60)
    assert r.returncode == 0, r.stderr
    stats = json.loads((tmp_path / "out" / "ingest_stats.json").read_text())
    skipped = {Path(s["path"]).name: s["reason"] for s in stats["skipped"]}
    assert skipped == {
        "pipe.jsonl": "a FIFO, not a regular file",
        "dangling.jsonl": "dangling symlink",
        "loop_a.jsonl": "symlink loop",
        "loop_b.jsonl": "symlink loop",
        "up": "symlink loop (folder already visited)",
    }
    assert stats["totals"]["n_files_skipped"] == 5
    for name in skipped:
        assert name in r.stdout
    files = {f["file"] for f in stats["files"]}
    assert str(proj / "nested" / "link.jsonl") in files
    _assert_good_ingested(stats, tmp_path / "out", base, tmp_path / "base_out")


def test_library_ingest_on_a_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "s.jsonl"
    os.mkfifo(fifo)
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from composer_replication.ingestion import ClaudeCodeIngester, CodexIngester, ingest_paths, read_states\n"
        "p = Path(sys.argv[1])\n"
        "for cls in (ClaudeCodeIngester, CodexIngester):\n"
        "    ing = cls()\n    assert list(ing.ingest(p)) == []\n    print(ing.last_stats.file_error)\n"
        "res = ingest_paths([p], sys.argv[2])\nprint(res['files'][0]['error'])\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", code, str(fifo), str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{fifo}: a FIFO, not a session file; skipped"] * 3


def test_ingester_on_a_missing_file_names_it(tmp_path: Path) -> None:
    for cls in (ClaudeCodeIngester, CodexIngester):
        ing = cls()
        assert list(ing.ingest(tmp_path / "gone.jsonl")) == []
        assert ing.last_stats.file_error == (
            f"{tmp_path / 'gone.jsonl'}: no such file (deleted or moved after it was listed?)"
        )
        assert ing.last_stats.n_file_errors == 1


def test_folder_symlinks_out_of_the_given_folder_are_not_followed(tmp_path: Path) -> None:
    """A folder symlink that leads outside the folder given is named and skipped; one inside it is walked."""
    base = _baseline(tmp_path)
    proj = _good_folder(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "private.jsonl").write_text("\n".join(_session_lines()) + "\n")
    (proj / "escape").symlink_to(elsewhere)
    (proj / "deep").mkdir()
    (proj / "deep" / "escape2").symlink_to(tmp_path)  # above the folder given
    (proj / "inner").mkdir()
    (proj / "inner" / "x.jsonl").write_text("\n".join(_session_lines()) + "\n")
    (proj / "alias").symlink_to(proj / "inner")  # inside: walked (once: the folder is visited once)
    r = _cli(str(proj), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    stats = json.loads((tmp_path / "out" / "ingest_stats.json").read_text())
    skipped = {Path(s["path"]).name: s["reason"] for s in stats["skipped"]}
    assert skipped == {
        "escape": f"symlink to a folder outside {proj} ({elsewhere}), not followed",
        "escape2": f"symlink to a folder outside {proj} ({tmp_path}), not followed",
    }
    assert "escape: symlink to a folder outside" in r.stdout
    files = sorted(Path(f["file"]).relative_to(proj).as_posix() for f in stats["files"])
    assert files == sorted([GOOD.name, GOOD_CODEX.name, "alias/x.jsonl"])
    assert "private" not in (tmp_path / "out" / "sessions.jsonl").read_text()
    _assert_good_ingested(stats, tmp_path / "out", base, tmp_path / "base_out")
    # A folder given as a symlink is followed (the user named it), and so are links inside its target.
    link = tmp_path / "link"
    link.symlink_to(proj)
    res = ingest_paths([link], tmp_path / "out2")
    assert {Path(s["path"]).name for s in res["skipped"]} == {"escape", "escape2"}
    assert len(res["files"]) == 3


@pytest.mark.parametrize("what", ["fifo", "dev_zero", "fifo_and_device"])
def test_only_unreadable_inputs_fail_with_one_line(tmp_path: Path, what: str) -> None:
    fifo = tmp_path / "s.jsonl"
    os.mkfifo(fifo)
    args = {"fifo": [str(fifo)], "dev_zero": ["/dev/zero"], "fifo_and_device": [str(fifo), "/dev/zero"]}[what]
    r = _cli(*args, "--out", str(tmp_path / "out"), timeout=60)  # never blocks on the FIFO or reads /dev/zero
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "no session file could be read: " in r.stderr
    kind = "a FIFO" if what != "dev_zero" else "a device"
    assert f"{args[0]}: {kind}, not a session file" in r.stderr
    assert ("(and 1 more)" in r.stderr) == (what == "fifo_and_device")
    assert "wrote " not in r.stdout


def test_a_file_deleted_while_listed_is_not_called_a_dangling_symlink(tmp_path: Path, monkeypatch) -> None:
    """The folder is listed, then a file in it is deleted before it is looked at (a real race, made
    deterministic): the reason says so; a real dangling symlink still says that."""
    from composer_replication.ingestion import scan_session_files

    proj = _good_folder(tmp_path / "run")
    doomed = proj / "doomed.jsonl"
    doomed.write_text("\n".join(_session_lines()) + "\n")
    (proj / "dangling.jsonl").symlink_to(proj / "nowhere.jsonl")
    real_scandir = os.scandir

    def list_then_delete(path):
        entries = list(real_scandir(path))
        if doomed.exists():
            doomed.unlink()
        return iter(entries)

    monkeypatch.setattr(os, "scandir", list_then_delete)
    files, skipped = scan_session_files([proj])
    monkeypatch.undo()
    reasons = {Path(s["path"]).name: s["reason"] for s in skipped}
    assert reasons == {
        "doomed.jsonl": "deleted or moved while the folder was listed",
        "dangling.jsonl": "dangling symlink",
    }
    assert sorted(f.name for f in files) == sorted([GOOD.name, GOOD_CODEX.name])
