"""The pipeline's online phase runs all three channels on the sandbox tasks: the policy objective on the
shaped reward, SDPO at the rollouts' failed tool calls, DPO on the mined pairs; a rerun resumes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from composer_replication import wire
from composer_replication.config import build_config
from composer_replication.datagen.rollout import task_prompt
from composer_replication.datagen.tasks import bundled_tasks
from composer_replication.models import build_tiny_model, save_tiny_pair
from composer_replication.pipeline.grpo_phase import phase_rows, task_rows, train_grpo_on_tasks
from composer_replication.pipeline.report import _is_reward, _series

pytest.importorskip("trl")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

FAILING_EDIT = wire.format_tool_use(
    "Edit", {"file_path": "mathx.py", "old_string": "nope", "new_string": "x"}
)
PAIR = {"state_id": "s::1", "state_messages": [{"role": "user", "content": "fix the test"}],
        "chosen": wire.format_tool_use("Read", {"file_path": "mathx.py"}), "rejected": FAILING_EDIT}  # fmt: skip


def _parrot(path, tok, prompt_messages, answer):
    """A real tiny model that learned to answer ``prompt_messages`` (with the sandbox tools) with
    ``answer`` in the wire format (150 AdamW steps)."""
    from composer_replication.datagen.tools import TOOL_SCHEMAS

    model = build_tiny_model(tokenizer=tok, seed=0)
    prompt = wire.render(tok, prompt_messages, TOOL_SCHEMAS)
    answer = wire.response_text(tok, answer, TOOL_SCHEMAS)
    ids = tok(prompt + answer + tok.eos_token, add_special_tokens=False, return_tensors="pt")["input_ids"]
    labels = ids.clone()
    labels[:, : len(tok(prompt, add_special_tokens=False)["input_ids"])] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return save_tiny_pair(path, model, tok)


def test_pairs_ride_along_on_task_rows():
    _, rows = task_rows(["off_by_one", "fix_import"])
    pairs = [{"state_id": str(i)} for i in range(3)]
    out = phase_rows(rows, pairs)
    assert [r["task"] for r in out] == ["off_by_one", "fix_import", "off_by_one"]
    assert [r["dpo_pair"]["state_id"] for r in out] == ["0", "1", "2"]
    assert phase_rows(rows, []) == rows


def test_report_plots_reward_parts_and_zero_spread_groups():
    rows = [
        {"step": 1, "reward": 0.2, "reward_std": 0.1, "frac_reward_zero_std": 0.5, "reward_parts/runs": 0.3}
    ]
    assert set(_series(rows, _is_reward)) == {"reward", "frac_reward_zero_std", "reward_parts/runs"}


@needs_bwrap
def test_online_phase_runs_all_three_channels_and_resumes(tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    task = bundled_tasks()["off_by_one"]
    model_dir = _parrot(tmp_path / "parrot", tok, task_prompt(task), FAILING_EDIT)
    (tmp_path / "pairs.jsonl").write_text(json.dumps(PAIR) + "\n")
    cfg = build_config({
        "mode": "grpo", "model": {"path": str(model_dir)},
        "data": {"pairs": str(tmp_path / "pairs.jsonl"), "max_seq_len": 2048, "max_dpo_seq_len": 256},
        "loss": {"sdpo": {"weight": 1.0}, "preference": {"weight": 1.0}},
        "optimizer": {"lr": 1e-4}, "schedule": {"max_steps": 2, "batch_size": 1},
        "checkpoint": {"every_steps": 1, "keep_last": 2}, "logging": {"progress": False},
        "grpo": {"num_generations": 2, "max_completion_length": 48, "temperature": 0.7},
    })  # fmt: skip
    out = tmp_path / "grpo"
    summary = train_grpo_on_tasks(cfg, out_dir=out, tasks=["off_by_one"], resume=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(
        {"reward", "frac_reward_zero_std", "reward_parts/format", "reward_parts/tests"} <= set(r)
        for r in rows
    )
    # the parrot's Edit fails in the sandbox: a hint, and the hinted teacher scores the completion
    assert any(r.get("sdpo/tokens", 0) > 0 for r in rows), rows
    assert all(r.get("pref/pairs", 0) >= 1 for r in rows)  # the mined pair rides along every step
    assert summary["steps"] == 2 and summary["rollouts_scored"] == 4 and summary["infra_errors"] == 0
    assert summary["pairs"] == 1 and summary["mean_sdpo_tokens"] > 0
    assert (out / "final" / "config.json").exists()
    # a rerun finds the last checkpoint at max_steps: no step is taken again, the log is the same
    again = train_grpo_on_tasks(cfg, out_dir=out, tasks=["off_by_one"], resume=True)
    assert again["steps"] == 2 and again["rollouts_scored"] == 0
    assert [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()] == rows
