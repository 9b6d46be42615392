"""The shaped sandbox reward on the bundled tasks, in a real sandbox: partial credit, graded tasks,
hints at failed calls, rewritten tests scored 0 and counted, infrastructure failures excluded."""

from __future__ import annotations

import shutil

import pytest

from composer_replication import wire
from composer_replication.datagen.bwrap_sandbox import BwrapSandbox
from composer_replication.datagen.env import InfraStats
from composer_replication.datagen.reward import WEIGHTS, make_shaped_reward, passed_fraction
from composer_replication.datagen.rollout import oracle_policy, task_prompt
from composer_replication.datagen.tasks import bundled_tasks

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def test_passed_fraction_reads_pytest_and_script_summaries():
    assert passed_fraction("..F\n1 failed, 2 passed in 0.05s\n", ok=False) == pytest.approx(2 / 3)
    assert passed_fraction("3 passed in 0.01s", ok=True) == 1.0
    assert passed_fraction("ERROR test_app.py\n1 error in 0.2s", ok=False) == 0.0
    assert passed_fraction("FAIL x\n5 passed, 2 failed", ok=False) == pytest.approx(5 / 7)
    assert passed_fraction("no summary here", ok=True) == 1.0
    assert passed_fraction("no summary here", ok=False) == 0.0


def _oracle_completion(task) -> str:
    """The oracle's tool calls as one completion (what tool-less GRPO applies)."""
    return "I'll fix it.\n\n" + wire.ACTION_SEP.join(
        s for s in oracle_policy(task).steps if s.startswith("[TOOL_USE]")
    )


@needs_bwrap
def test_oracle_scores_one_idling_scores_the_baseline_and_tasks_are_graded():
    tasks = bundled_tasks()
    assert len(tasks) >= 7
    reward = make_shaped_reward(tasks)
    names = sorted(tasks)
    good = reward(completions=[_oracle_completion(tasks[n]) for n in names], task=names)
    assert good == [pytest.approx(1.0)] * len(names), dict(zip(names, reward.last_parts))
    idle = reward(completions=["I would fix it."] * len(names), task=names)
    base = {n: p["tests"] for n, p in zip(names, reward.last_parts)}
    # doing nothing earns the share of tests that already pass, never the whole task
    assert all(r == pytest.approx(WEIGHTS["tests"] * base[n]) for r, n in zip(idle, names))
    assert all(b < 1.0 for b in base.values()) and reward.last_hints == [None] * len(names)
    # the trivial task spells out the whole action in the active wire format (its example_call); copied
    # verbatim, it solves the task, and the prompt never shows the other format's markup
    word = tasks["write_word"]
    for fmt, shown, other in (("native", "<tool_call>", "[TOOL_USE]"), ("text", "[TOOL_USE]", "<tool_call>")):
        with wire.use_format(fmt):
            prompt = task_prompt(word)[1]["content"]
            call = wire.example_call("Bash", {"command": "echo done > status.txt"})
            assert call in prompt and shown in prompt and other not in prompt, (fmt, prompt[:300])
            assert list(wire.parse_action(call).tool_calls) == [
                ("Bash", {"command": "echo done > status.txt"})
            ]
            assert reward(completions=[call], task=["write_word"]) == [pytest.approx(1.0)], fmt


@needs_bwrap
def test_partial_credit_and_hints_at_failed_calls():
    tasks = bundled_tasks()
    reward = make_shaped_reward(tasks)
    runs = wire.format_tool_use("Bash", {"command": "ls"})
    bad_edit = wire.format_tool_use(
        "Edit", {"file_path": "mathx.py", "old_string": "nope", "new_string": "x"}
    )
    malformed = '[TOOL_USE] name=Bash input={"command": "ls"'
    unknown = wire.format_tool_use("Grep", {"pattern": "x"})
    out = reward(completions=[runs, runs + "\n" + bad_edit, malformed, unknown], task=["off_by_one"] * 4)
    parts, hints = reward.last_parts, reward.last_hints
    base = WEIGHTS["tests"] * parts[0]["tests"]
    assert parts[0] == {"format": 1.0, "runs": 1.0, "tests": pytest.approx(1 / 3)}
    assert out[0] == pytest.approx(WEIGHTS["format"] + WEIGHTS["runs"] + base) and hints[0] is None
    assert parts[1]["runs"] == 0.5 and out[1] == pytest.approx(
        WEIGHTS["format"] + 0.5 * WEIGHTS["runs"] + base
    )
    assert "match the file exactly" in hints[1]  # edit_mismatch template
    assert parts[2]["format"] == 0.0 and out[2] == pytest.approx(base) and "valid JSON" in hints[2]
    assert parts[3] == {"format": 0.0, "runs": 0.0, "tests": pytest.approx(1 / 3)} and "Grep" in hints[3]
    assert out[0] > out[1] > out[2] == out[3]  # well-formed and running beats failing beats malformed


@needs_bwrap
def test_rewriting_the_tests_does_not_pass_them():
    tasks = bundled_tasks()
    reward = make_shaped_reward(tasks)
    cheat = wire.format_tool_use(
        "Write", {"file_path": "test_mathx.py", "content": "def test_ok():\n    pass\n"}
    )
    out = reward(completions=[cheat, _oracle_completion(tasks["off_by_one"])], task=["off_by_one"] * 2)
    # the test part of an attempt is 0 (default on_protected="zero"); it is counted, the real fix is not
    assert reward.last_parts[0]["tests"] == 0.0 and out[0] == pytest.approx(0.3)
    assert out[1] == pytest.approx(1.0) and [v.hacked for v in reward.last_verdicts] == [True, False]
    assert reward.last_verdicts[0].protected_touched == ["test_mathx.py"]
    assert reward.last_hack_attempts == reward.reward_hack_attempts == reward.stats.reward_hack_attempts == 1
    lenient = make_shaped_reward(tasks, on_protected="restore")
    lenient(completions=[cheat], task=["off_by_one"])  # scored with the task's tests put back
    assert lenient.last_parts[0]["tests"] == pytest.approx(1 / 3) and lenient.reward_hack_attempts == 1


def test_infrastructure_failure_is_none_and_excluded(tmp_path):
    stats = InfraStats()
    reward = make_shaped_reward(
        sandbox_factory=lambda: BwrapSandbox(bwrap=str(tmp_path / "nope")), stats=stats
    )
    call = wire.format_tool_use("Bash", {"command": "true"})
    assert reward(completions=[call, "text"], task=["fix_import", "off_by_one"]) == [None, None]
    assert stats.infra_errors == 2 and stats.scored == 0 and reward.last_hints == [None, None]
    with pytest.raises(ValueError, match="known tasks"):
        reward(completions=["x"], task=["nope"])
    with pytest.raises(ValueError, match="weights"):
        make_shaped_reward(weights={"format": 1.0})
