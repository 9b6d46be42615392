"""GRPO on sandboxed coding tasks: rewards from real test runs; an injected infra failure is excluded, not scored."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest

from composer_replication.datagen.bwrap_sandbox import BwrapSandbox
from composer_replication.datagen.env import InfraStats, SandboxCodingEnv, make_test_reward
from composer_replication.datagen.rollout import oracle_policy
from composer_replication.datagen.tasks import Task, bundled_tasks
from composer_replication.datagen.tools import format_tool_call

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def _tasks() -> dict[str, Task]:
    tasks = bundled_tasks()
    obo = tasks["off_by_one"]
    # The same bundled task with its fix already applied: its tests really pass in the sandbox.
    tasks["off_by_one_solved"] = Task(
        "off_by_one_solved", obo.instruction, obo.test_command, {**obo.files, **obo.solution}
    )
    return tasks


def _tool_tokenizer(tiny_tokenizer):
    """The tiny tokenizer with TRL's Qwen2.5 tool-calling template and response schema (no download)."""
    import copy

    import trl
    from trl.chat_template_utils import add_response_schema

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    tok.padding_side = "left"
    return add_response_schema(tok)


@pytest.mark.slow  # ~25 s unloaded (3 GRPO steps, 12 sandboxed test runs); ~80 s on a busy 2-core box
def test_grpo_with_sandbox_env_excludes_infra_failures(tiny_tokenizer, tmp_path):
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    from composer_replication.models import build_tiny_model
    from composer_replication.trainer.composer_trainer import ComposerReplicationTrainer

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    torch.set_num_threads(1)
    tasks = _tasks()
    tok = _tool_tokenizer(tiny_tokenizer)
    model = build_tiny_model(tokenizer=tok, seed=0)
    calls = []

    def factory():  # the 2nd sandbox of the run cannot start: a real infrastructure failure
        calls.append(1)
        return BwrapSandbox(bwrap=str(tmp_path / "missing-bwrap")) if len(calls) == 2 else BwrapSandbox()

    stats = InfraStats()
    advantages = []

    class Spy(ComposerReplicationTrainer):
        def _compute_loss(self, model, inputs):
            advantages.append(inputs["advantages"].detach().clone())
            return super()._compute_loss(model, inputs)

    rows = [tasks[n].to_row() for n in ("off_by_one_solved", "fix_import", "implement_function")]
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        max_steps=3,
        logging_steps=1,
        beta=0.0,
        shuffle_dataset=False,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Spy(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        environment_factory=lambda: SandboxCodingEnv(tasks, sandbox_factory=factory, stats=stats),
        alpha_sdpo=0.0,
        beta_replay=0.0,
    )
    trainer.train()

    assert stats.infra_errors == 1 and stats.scored == 11
    assert stats.rewards[:4] == [1.0, None, 1.0, 1.0]  # group 1: the solved task, one infra failure
    assert stats.rewards[4:] == [0.0] * 8  # the junk policy does not fix the real tasks
    logs = [h for h in trainer.state.log_history if "reward" in h]
    # Excluded, not scored: the group mean is 1.0 (a 0 would make it 0.75 and give the others an advantage).
    assert [h["reward"] for h in logs] == [1.0, 0.0, 0.0]
    assert all(torch.equal(a, torch.zeros_like(a)) for a in advantages)
    assert all(math.isfinite(h["loss"]) for h in logs)


def test_scripted_policy_scores_one_through_the_same_reward_paths():
    tasks = _tasks()
    stats = InfraStats()
    reward = make_test_reward(tasks, stats=stats)
    good = [{"role": "assistant", "content": oracle_policy(tasks["fix_import"]).steps[0]}]
    junk = [{"role": "assistant", "content": "[TOOL_USE] name=Write input={oops\nhello"}]
    out = reward(
        completions=[good, junk, "I refuse"], task=["fix_import", "fix_import", "implement_function"]
    )
    assert out == [1.0, 0.0, 0.0]
    env = SandboxCodingEnv(tasks, stats=stats)
    env.reset(task="implement_function")
    sol = tasks["implement_function"].solution["text.py"]
    assert env.write("text.py", sol) == "The file /workspace/text.py has been updated successfully."
    assert "ok" in env.bash("python3 test_text.py")
    assert env.get_reward() == 1.0
    env.reset(task="off_by_one")
    assert "has been updated successfully" in env.edit("mathx.py", "range(1, n)", "range(1, n + 1)")
    assert "sum_to" in env.read("mathx.py")
    assert env.get_reward() == 1.0
    assert stats.scored == 5 and stats.infra_errors == 0


def test_reward_returns_none_on_infra_failure(tmp_path):
    stats = InfraStats()
    reward = make_test_reward(sandbox_factory=lambda: BwrapSandbox(bwrap=str(tmp_path / "nope")), stats=stats)
    completion = format_tool_call("Bash", {"command": "true"})
    assert reward(completions=[completion], task=["fix_import"]) == [None]
    assert stats.infra_errors == 1 and "bubblewrap" in stats.errors[0]
    with pytest.raises(ValueError, match="known tasks"):
        SandboxCodingEnv(stats=stats).reset(task="nope")
