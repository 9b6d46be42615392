"""Bug 11: a GRPO phase resumed from a checkpoint already at ``max_steps`` must not train another step.

HF Trainer checks ``max_steps`` only after a step, so resuming at ``global_step == max_steps`` with
batches left in the epoch (two tasks here) used to end at step 2 for ``max_steps: 1``. The real CLI
version of this (Ctrl-C during the pipeline's GRPO phase, then a rerun) is in
``tests/adversarial/test_cli_interrupts.py``.
"""

from __future__ import annotations

import json

from composer_replication.config import build_config
from composer_replication.pipeline.grpo_phase import train_grpo_on_tasks


def _steps(out_dir):
    return sorted(
        json.loads((c / "trainer_state.json").read_text())["global_step"]
        for c in (out_dir / "checkpoints").glob("checkpoint-*")
    )


def test_resume_at_max_steps_trains_nothing_more(tmp_path, tiny_model_dir):
    (tmp_path / "traces.jsonl").write_text("")
    cfg = build_config(
        {
            "mode": "grpo", "model": {"path": str(tiny_model_dir)}, "data": {"traces": str(tmp_path / "traces.jsonl")},
            "schedule": {"max_steps": 1}, "checkpoint": {"every_steps": 1},
            "logging": {"progress": False}, "grpo": {"num_generations": 2, "max_completion_length": 8},
        }
    )  # fmt: skip
    out = tmp_path / "grpo"
    tasks = ["off_by_one", "fix_import"]  # two prompts: the epoch has a second step left after step 1
    first = train_grpo_on_tasks(cfg, out_dir=out, tasks=tasks, resume=True)
    assert first["steps"] == 1 and _steps(out) == [1]
    final_before = (out / "final" / "model.safetensors").read_bytes()

    second = train_grpo_on_tasks(
        cfg, out_dir=out, tasks=tasks, resume=True
    )  # the rerun after an interruption
    assert second["steps"] == 1 and _steps(out) == [1]  # was 2 (and checkpoint-2) before the fix
    assert (out / "final" / "model.safetensors").read_bytes() == final_before  # the checkpoint's weights
    assert [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [1]
