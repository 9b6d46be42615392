"""The CLI where its output goes nowhere, or its argument is not a run: a reader that closed the pipe
(`... | head -1`) ends a command quietly with 141, as SIGPIPE would; `status` of a path that is no run
directory says what the path is, in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from composer_replication.pipeline.manifest import Manifest
from composer_replication.teacher_replay.fake_server import sample_states


def _closed_pipe_run(*args: str) -> subprocess.CompletedProcess:
    """The real CLI with stdout a pipe whose reader is already gone: its first write fails (EPIPE)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(
            [sys.executable, "-m", "composer_replication.cli.main", *args],
            stdout=w, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.close(w)


@pytest.fixture()
def run_dir(tmp_path):
    Manifest(tmp_path / "run").save()
    return tmp_path / "run"


def test_status_into_a_closed_pipe_exits_quietly(run_dir, tmp_path):
    states = tmp_path / "states.jsonl"
    states.write_text("".join(json.dumps(s) + "\n" for s in sample_states(3)))
    # argparse's own --help/--version swallow the error of their write (exit 0); the commands' output: 141
    for args, code in (
        (["status", str(run_dir)], 141),
        (["status", "--json", str(run_dir)], 141),
        (["replay", str(states), "--out", str(tmp_path / "out"), "--max-usd", "1", "--dry-run"], 141),
        (["--version"], 0),
        (["status", "--help"], 0),
    ):
        p = _closed_pipe_run(*args)
        assert p.returncode == code, (args, p.stderr)
        assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, (args, p.stderr)


def test_status_of_what_is_not_a_run_directory_is_one_clear_line(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    cases = {
        tmp_path / "missing": "no such directory",
        a_file: "is a file, not a run directory",
        tmp_path: "not a run directory: it has no manifest.json",
    }
    for path, says in cases.items():
        p = subprocess.run(
            [sys.executable, "-m", "composer_replication.cli.main", "status", str(path)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert p.returncode == 1 and p.stdout == "", p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and str(path) in lines[0], p.stderr


def test_run_as_the_program_the_cli_skips_the_last_cyclic_collection(tmp_path):
    """After the command, the program's objects are frozen (gc.freeze): the interpreter's final cyclic
    collection over torch & co. took seconds, which a Ctrl-C had to wait for. Called as a function
    (argv given, e.g. from tests or a notebook) nothing is frozen."""
    code = (
        "import gc, sys\n"
        "from composer_replication.cli.main import main\n"
        f"assert main(['status', {str(tmp_path / 'missing')!r}]) == 1 and gc.get_freeze_count() == 0\n"
        f"sys.argv = ['composer-replication', 'status', {str(tmp_path / 'missing')!r}]\n"
        "code = main()\n"
        "print(code, gc.get_freeze_count() > 0)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.split() == ["1", "True"], p.stderr
