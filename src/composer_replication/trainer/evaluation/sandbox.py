"""Sandbox pass rate: greedy agent rollouts of a saved model on bundled tasks, scored by their tests.

``sandbox_pass_rate(model_dir, out_dir, tasks=...)`` rolls the model out on each task the names give
(``trainer.grpo.tasks.load_task_set``: the tasks GRPO trains on), in the sandbox, and returns the pass
rate over the tasks scored, with the infrastructure failures and reward-hack attempts counted apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def sandbox_pass_rate(
    model_dir: Path, out_dir: Path, *, tasks: list[str], max_turns: int, max_new_tokens: int, stop: Any = None
) -> dict[str, Any]:
    """Greedy agent rollouts of ``model_dir`` on the bundled tasks; pass rate over the scored ones.

    Rollouts are indexed in ``out_dir/rollouts.jsonl`` (``datagen.run_rollouts`` skips finished ones), so
    a rerun only rolls out what is missing. ``out_dir`` must be specific to the model's weights.
    """
    from composer_replication._io import read_jsonl
    from composer_replication.datagen.rollout import HFPolicy, run_rollouts
    from composer_replication.models import load_model_and_tokenizer
    from composer_replication.trainer.grpo.tasks import load_task_set

    chosen = load_task_set(tasks).tasks
    index = out_dir / "rollouts.jsonl"
    done = {r["rollout_id"] for r in read_jsonl(index) if r["status"] == "ok"} if index.exists() else set()
    if any(f"{n}-000" not in done for n in chosen):
        model, tok = load_model_and_tokenizer(model_dir)  # float32, a pad token; an adapter merged
        model.eval()
        policy = HFPolicy(model, tok, max_new_tokens=max_new_tokens, temperature=0.0)
        run_rollouts(
            list(chosen.values()), lambda t: policy, out_dir, max_turns=max_turns, stop=stop, progress=False
        )
    latest = {r["rollout_id"]: r for r in read_jsonl(index)}
    scored = [r for r in latest.values() if r["status"] == "ok" and r["task"] in chosen]
    return {
        "sandbox_tasks": len(chosen),
        "sandbox_scored": len(scored),
        "sandbox_infra_errors": sum(r["status"] != "ok" for r in latest.values()),
        "sandbox_reward_hack_attempts": sum(bool(r.get("reward_hack")) for r in scored),
        "sandbox_pass_rate": sum(r["reward"] for r in scored) / len(scored) if scored else None,
    }
