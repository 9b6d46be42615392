"""A run directory with every file the report reads, written by hand (report tests)."""

from __future__ import annotations

import json

from composer_replication._io import write_jsonl_atomic
from composer_replication.pipeline.manifest import Manifest


def fake_run(d, *, cost_usd: float = 0.001) -> None:
    m = Manifest(d)
    for name in ("ingest", "replay", "train_offline"):
        rec = m.stage(name)
        rec.status, rec.summary = "done", {"n": 3}
    m.save()
    write_jsonl_atomic(
        d / "train" / "offline" / "metrics.jsonl",
        [
            {"step": s, "loss/total": 3.0 / s, "loss/lm_ce": 2.0 / s, "loss/sdpo_jsd": 0.5, "grad_norm": 1.0}
            for s in range(1, 5)
        ],
    )
    write_jsonl_atomic(
        d / "train" / "grpo" / "metrics.jsonl",
        [{"step": s, "loss": 0.1 * s, "reward": 0.25 * s, "reward_std": 0.1} for s in range(1, 3)],
    )
    write_jsonl_atomic(
        d / "replay" / "teacher_calls.jsonl",
        [
            {
                "state_id": f"t::{i}",
                "teacher_slug": t,
                "cost_usd": cost_usd * i,
                "response_text": "x",
                "error": None,
            }
            for i in range(3)
            for t in ("a/x", "b/y")
        ],
    )
    (d / "pairs").mkdir()
    (d / "pairs" / "per_teacher.json").write_text(json.dumps({"a/x": 2, "b/y": 1}))
    (d / "eval").mkdir()
    (d / "eval" / "eval.json").write_text(json.dumps(eval_json()))


def eval_json(valid_after: list[float] | None = None) -> dict:
    """An ``eval.json`` of the shape the evaluate stage writes: the paired site comparison (``sites``),
    the sandbox pass rate over its tasks, and one greedy sample answer per phase."""
    from composer_replication.trainer.evaluation.paired import paired

    per = {"before": {"recovery_ce": [2.0, 2.4, 3.0, 2.2], "valid_rate": [0.0, 1.0, 0.0, 0.0],
                      "tool_match_rate": [0.0, 0.0, 0.0, 0.0]},
           "after": {"recovery_ce": [1.8, 2.0, 2.7, 2.0], "valid_rate": valid_after or [1.0, 1.0, 0.0, 0.0],
                     "tool_match_rate": [0.0, 1.0, 0.0, 0.0]}}  # fmt: skip
    sites = {"n_sites": 4, "metrics": {m: paired(per["before"][m], per["after"][m]) for m in per["before"]},
             "per_site": per, "site_ids": [f"t::s{i}" for i in range(4)],
             "answers": {"before": ["loops loops loops", "[TOOL_USE] name=Read", "", ""],
                         "after": ["[TOOL_USE] name=Bash input={}", "[TOOL_USE] name=Read", "", ""]}}  # fmt: skip
    sample = {"state_id": "t::0001", "valid": False, "output": "The function is defined in the function"}
    return {
        "note": "n",
        "heldout_sites": 1,
        "before": {"n_sites": 1, "valid_rate": 0.0, "sites": [sample], "sandbox_tasks": 2, "sandbox_scored": 2,
                   "sandbox_pass_rate": 0.0},
        "after": {"n_sites": 1, "valid_rate": 0.0, "sites": [{**sample, "output": "[TOOL_USE] name=Bash"}],
                  "sandbox_tasks": 2, "sandbox_scored": 2, "sandbox_pass_rate": 0.5},
        "sites": sites,
    }  # fmt: skip
