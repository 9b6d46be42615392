"""`run` with a `tasks` section: mine -> eval before -> train (GRPO on the mined tasks) -> eval after, from
one config, on a real git repository and a Claude Code session; the report shows before/after."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from composer_replication.config.run import load_run_config
from composer_replication.pipeline.manifest import Manifest
from composer_replication.pipeline.stages import run_pipeline

from .conftest import reduced_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tasks"))
from _mining import fix_session, make_repo  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed"),
]
TASK_STAGES = ["mine_tasks", "eval_tasks_before", "train_grpo", "eval_tasks_after"]


def test_run_chains_mine_eval_train_eval(tmp_path, teacher_server):
    make_repo(tmp_path / "repo")
    fix_session(tmp_path / "repo").save(tmp_path / "logs")
    tasks = {
        "sessions": ["logs"],
        "sandbox": "bwrap",
        "max_turns": 1,
        "max_new_tokens": 16,
        "check_timeout_s": 30,
    }
    cfg = reduced_config(tmp_path, teacher_server.url, tasks=tasks, grpo={"tasks": None},
                         evaluate={"sandbox_tasks": False})  # fmt: skip
    config = load_run_config(cfg)
    assert config.tasks.sessions == [str(tmp_path / "logs")]  # relative to the config file
    run = tmp_path / "run"
    run_pipeline(config, run, log=lambda _: None)
    m = Manifest.load(run)
    assert all(r.status == "done" for r in m.stages.values()), {
        n: (r.status, r.error) for n, r in m.stages.items()
    }
    names = list(m.stages)
    assert [n for n in names if n in TASK_STAGES] == TASK_STAGES
    assert names.index("eval_tasks_before") < names.index("train_offline")
    assert names.index("eval_tasks_after") > names.index("train_grpo")
    assert m.stages["mine_tasks"].summary["tasks"] == 1
    grpo = json.loads((run / "train" / "grpo" / "final_metrics.json").read_text())
    assert grpo["task_set"] == str(run / "tasks" / "mined") and grpo["tasks"] == 1
    assert grpo["rollouts_scored"] == 2 and grpo["mean_frac_reward_zero_std"] is not None
    before, after = (
        json.loads((run / "tasks" / f"eval_{p}" / "eval.json").read_text()) for p in ("before", "after")
    )
    assert [p["name"] for p in before["policies"] + after["policies"]] == ["student", "trained"]
    assert before["policies"][0]["tasks_scored"] == 1 and after["policies"][0]["infra_failures"] == 0
    c = json.loads((run / "tasks" / "before_after.json").read_text())
    assert (c["a"], c["b"], c["n_tasks"]) == ("student", "trained", 1) and "delta" in c["pass@1"]
    page = (run / "report" / "report.html").read_text()
    assert "Your tasks, before and after training" in page and "trained against student" in page
    # a rerun finds every stage current: nothing is mined, evaluated or trained again
    run_pipeline(config, run, log=lambda _: None)
    assert (
        Manifest.load(run).stages["eval_tasks_after"].finished_at == m.stages["eval_tasks_after"].finished_at
    )
