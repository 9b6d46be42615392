"""`eval` with the built-in policies on mined tasks and on the bundled ones, through the CLI; the `tasks mine`
CLI; infrastructure failures counted apart; a hand-broken task folder named and skipped."""

from __future__ import annotations

import json

import pytest
from _mining import CodexSession, fix_session, make_repo

from composer_replication.cli.main import main
from composer_replication.datagen.bwrap_sandbox import BwrapSandbox
from composer_replication.tasks.evaluate import NoopPolicy, ReferencePolicy, evaluate, pass_at_k


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    make_repo(root / "a")
    fix_session(root / "a").save(root / "logs")
    make_repo(root / "b", {"calc.py": "def sub(a, b):\n    return a + b\n", "gone.py": "x = 1\n",
                           "test_calc.py": "import os\nfrom calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"
                           "\n\ndef test_gone():\n    assert not os.path.exists('gone.py')\n"})  # fmt: skip
    cx = CodexSession(str(root / "b")).user("fix sub and remove gone.py")
    cx.shell("python -m pytest -q", "2 failed", exit_code=1)
    cx.apply_patch(
        "*** Update File: calc.py\n@@\n-    return a + b\n+    return a - b\n*** Delete File: gone.py"
    )
    cx.shell("python -m pytest -q", "2 passed").save(root / "logs")
    out = root / "TASKS"
    code = main(
        [
            "tasks",
            "mine",
            str(root / "logs"),
            "--out",
            str(out),
            "--sandbox",
            "bwrap",
            "--check-timeout",
            "20",
        ]
    )
    assert code == 0
    assert json.loads((out / "report.json").read_text())["counts"]["tasks"] == 2
    return out


def test_reference_solves_every_mined_task_and_noop_none(task_dir, tmp_path, capsys):
    code = main(
        [
            "eval",
            str(task_dir),
            "--policy",
            "reference",
            "--policy",
            "noop",
            "--out",
            str(tmp_path),
            "--sandbox",
            "bwrap",
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "eval.json").read_text())
    ref, noop = result["policies"]
    assert (ref["name"], ref["pass@1"], ref["checks_share"], ref["infra_failures"]) == (
        "reference",
        1.0,
        1.0,
        0,
    )
    assert (noop["name"], noop["pass@1"], noop["checks_share"]) == ("noop", 0.0, 0.0)
    assert len(ref["rows"]) == 2 and all(r["solved"] == 1 for r in ref["rows"])
    assert "reference: pass@1 1.0" in capsys.readouterr().out


def test_bundled_tasks_in_the_task_json_layout_score_the_same_way(tmp_path):
    import shutil

    from composer_replication.datagen.tasks import BUNDLED_DIR

    for name in ("off_by_one", "fix_import"):
        shutil.copytree(BUNDLED_DIR / name, tmp_path / "T" / name)
    result = evaluate(
        tmp_path / "T", [ReferencePolicy(), NoopPolicy()], tmp_path, sandbox="bwrap", log=lambda _: None
    )
    assert [p["pass@1"] for p in result["policies"]] == [1.0, 0.0]


def test_infrastructure_failures_are_counted_apart_never_scored(task_dir, tmp_path):
    broken = lambda: BwrapSandbox(bwrap="/nonexistent/bwrap")  # noqa: E731
    result = evaluate(task_dir, [ReferencePolicy()], tmp_path, sandbox=broken, log=lambda _: None)
    (p,) = result["policies"]
    assert p["pass@1"] is None and p["tasks_scored"] == 0 and p["infra_failures"] == 2
    assert all(r["infra_errors"] and "bubblewrap not found" in r["infra_errors"][0] for r in p["rows"])


def test_a_hand_broken_task_folder_is_named_and_skipped(task_dir, tmp_path, capsys):
    import shutil

    tasks = tmp_path / "T"
    shutil.copytree(task_dir, tasks)
    victim = sorted(p for p in tasks.iterdir() if p.is_dir())[0]
    (victim / "task.toml").write_text("[verifier]\nchecks = 'not a list'\n")
    code = main(["eval", str(tasks), "--policy", "noop", "--out", str(tmp_path / "o"), "--sandbox", "bwrap"])
    assert code == 0
    result = json.loads((tmp_path / "o" / "eval.json").read_text())
    assert result["n_tasks"] == 1 and result["malformed"][0]["task"] == victim.name
    err = [ln for ln in capsys.readouterr().out.splitlines() if victim.name in ln and "skipped" in ln]
    assert len(err) == 1 and "checks must be a non-empty list" in err[0]


def test_cli_usage_errors_are_one_line(tmp_path, capsys):
    assert main(["tasks", "mine", str(tmp_path), "--out", str(tmp_path / "o"), "--repo-map", "nonsense"]) == 1
    assert "expected OLD=NEW" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "none"), "--policy", "noop", "--out", str(tmp_path)]) == 1
    assert "no such tasks directory" in capsys.readouterr().err


def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
