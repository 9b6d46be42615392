"""GRPO on a mined-style task folder (`grpo.tasks: DIR`): the shaped reward scores the share of the task's
checks' tests passing plus the format and runs terms, per task in its own sandbox; `train --mode grpo` runs
two steps on the folder with the tiny model and reports reward and the share of zero-variance groups."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tasks"))
from _taskdir import TASKS, write_tasks  # noqa: E402

from composer_replication.config import ConfigError, build_config  # noqa: E402
from composer_replication.datagen.sandbox import make_sandbox  # noqa: E402
from composer_replication.trainer.grpo.tasks import load_task_set, task_rows  # noqa: E402
from composer_replication.wire import format_tool_use  # noqa: E402

pytest.importorskip("trl")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@needs_bwrap
def test_shaped_reward_on_mined_tasks_gives_the_share_of_tests_passing(tmp_path):
    from composer_replication.datagen.env import InfraStats
    from composer_replication.datagen.reward import make_shaped_reward

    ts = load_task_set(str(write_tasks(tmp_path / "T")), sandbox="bwrap", log=lambda _: None)
    assert sorted(ts.tasks) == ["fix-mul", "fix-sub"] and ts.where.endswith("T")
    assert {r["task"] for r in task_rows(ts)} == {"fix-mul", "fix-sub"}
    used: list[str] = []

    def counted(name):
        def make():
            used.append(name)
            return make_sandbox("bwrap")

        return make

    fix = format_tool_use(
        "Write", {"file_path": "calc.py", "content": TASKS["fix-mul"]["solution"]["calc.py"]}
    )
    broken = format_tool_use("Edit", {"file_path": "calc.py", "old_string": "nope", "new_string": "x"})
    stats = InfraStats()
    reward = make_shaped_reward(ts.tasks, stats=stats, task_sandboxes={"fix-mul": counted("fix-mul")})
    got = reward([fix, "no tool call", broken, fix], task=["fix-mul", "fix-mul", "fix-mul", "fix-sub"])
    # fix: every term; no call: only test_two passes (0.7 * 1/2); a failing Edit: format, no run, 1/2 of
    # the tests; fix-mul's code on fix-sub: its one test still fails
    assert got == pytest.approx([1.0, 0.35, 0.1 + 0.35, 0.1 + 0.2])
    assert used.count("fix-mul") == 6  # the completion's sandbox and the verifier's, per fix-mul completion
    assert reward.last_hints[2] and "nope" in reward.last_hints[2]  # SDPO's hint at the failed call
    assert stats.infra_errors == 0 and stats.scored == 4


def test_grpo_tasks_config(tmp_path):
    tasks = write_tasks(tmp_path / "T")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"mode": "grpo", "grpo": {"tasks": "T"}}))
    from composer_replication.config import load_config

    assert load_config(tmp_path / "c.yaml").grpo.tasks == str(tasks)  # relative to the config file
    with pytest.raises(ConfigError, match="no such task directory"):
        build_config({"mode": "grpo", "grpo": {"tasks": str(tmp_path / "none")}})
    with pytest.raises(ConfigError, match="or in grpo mode grpo.tasks"):
        build_config({"mode": "grpo"})
    with pytest.raises(ValueError, match="unknown task"):
        load_task_set(["no_such_task"])
    (tasks / "fix-sub" / "task.toml").write_text("[verifier]\nchecks = 'x'\n")
    said: list[str] = []
    ts = load_task_set(str(tasks), log=said.append)
    assert list(ts.tasks) == ["fix-mul"] and ts.left_out[0]["task"] == "fix-sub"
    assert len(said) == 1 and "fix-sub" in said[0]


@needs_bwrap
def test_train_grpo_mode_on_a_mined_task_folder(tmp_path, capsys):
    from composer_replication.cli.main import main

    write_tasks(tmp_path / "T")
    cfg = {
        "mode": "grpo", "model": {"path": "tiny"},
        "data": {"max_seq_len": 1024},
        "schedule": {"max_steps": 2, "batch_size": 1},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
        "grpo": {"num_generations": 2, "max_completion_length": 16},
        "logging": {"progress": False, "plot": False},
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    code = main(
        ["train", str(tmp_path / "c.yaml"), "--tasks", str(tmp_path / "T"), "--out", str(tmp_path / "run")]
    )
    assert code == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all({"reward", "frac_reward_zero_std", "reward_parts/tests"} <= set(r) for r in rows)
    final = json.loads((tmp_path / "run" / "final_metrics.json").read_text())
    assert final["tasks"] == 2 and final["rollouts_scored"] == 4 and final["infra_errors"] == 0
    assert final["mean_reward"] is not None and 0.0 <= final["mean_frac_reward_zero_std"] <= 1.0
    assert (tmp_path / "run" / "final" / "config.json").exists()
    assert '"mean_frac_reward_zero_std"' in capsys.readouterr().out


def test_a_task_prompt_keeps_its_instruction_when_the_window_is_short(tiny_tokenizer):
    """The demo trains with max_seq_len 256; a task's prompt (system message with four tool schemas, the
    instruction, the workspace files) is longer. Cut like a history it kept the end of the files and lost
    the instruction, so no GRPO sample ever sent the call the instruction spells out."""
    from composer_replication import wire
    from composer_replication.datagen.rollout import task_prompt
    from composer_replication.trainer.grpo.build import fit_prompts

    tok = wire.prepare_tokenizer(tiny_tokenizer)
    (row,) = task_rows(load_task_set(["write_word"]))
    assert len(wire.render_ids(tok, row["prompt"], row["tools"])) > 256
    history = {"prompt": [*row["prompt"], {"role": "user", "content": "more " * 400}], "tools": row["tools"]}
    rows = [dict(row), dict(history)]
    fit_prompts(rows, tok, 256)
    assert rows[0]["prompt"] == task_prompt(load_task_set(["write_word"]).tasks["write_word"])
    assert "Replace its contents" in rows[0]["prompt"][1]["content"]
    # a history is still cut to the window (its last message keeps its end)
    assert rows[1]["prompt"][-1]["content"] != history["prompt"][-1]["content"]
    assert history["prompt"][-1]["content"].endswith(rows[1]["prompt"][-1]["content"])
