"""Monarch actors for the Composer pipeline: sandboxed rollout workers, teacher-replay workers, a trainer.

Each actor is a thin shell over the library (``datagen.rollout``, ``ingestion``, ``teacher_replay``,
``loss``): Monarch only places them on processes (locally ``this_host().spawn_procs``, on a cluster a
``HostMesh`` from ``monarch.job``) and carries plain dicts between them. `run_pipeline_step` wires one
step: rollouts in the sandbox -> ingest + teacher replay -> one training step on the trainer, polling the
kill switch between stages. ``python3 -m composer_replication.recipes.monarch.example`` runs it on CPU.

Requires the ``monarch`` extra (``pip install 'composer-replication[monarch]'``; torchmonarch >= 0.7 with
cloudpickle >= 3).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from composer_replication._extras import require
from composer_replication.safety.kill_switch import KillSwitchTriggered
from composer_replication.safety.stop import Stop, as_stop

require("monarch", purpose="the Monarch recipe")
import cloudpickle  # noqa: E402
from monarch.actor import Actor, current_rank, endpoint, this_host  # noqa: E402

if TYPE_CHECKING:
    from composer_replication.datagen.sandbox import SandboxType
    from composer_replication.teacher_replay.types import TeacherSpec, TraceState

if not hasattr(cloudpickle.cloudpickle, "_function_getstate"):  # monarch panics deep in Rust otherwise
    raise ImportError(
        f"torchmonarch needs cloudpickle >= 3 (found {cloudpickle.__version__}): pip install 'cloudpickle>=3'"
    )


class RolloutWorker(Actor):
    """Runs coding tasks as a tool-calling agent in a sandbox; one task per rank per call."""

    def __init__(
        self, out_dir: str, sandbox_type: SandboxType | None = None, model_dir: str | None = None
    ) -> None:
        self.out_dir = Path(out_dir)
        self.sandbox_type = sandbox_type
        self.model_dir = model_dir
        self._policy: Any = None

    def _policy_for(self, task: Any) -> Any:
        from composer_replication.datagen.rollout import HFPolicy, oracle_policy

        if self.model_dir is None:
            return oracle_policy(task)
        if self._policy is None:
            from composer_replication.models import load_model_and_tokenizer

            self._policy = HFPolicy(*load_model_and_tokenizer(self.model_dir), max_new_tokens=64)
        return self._policy

    @endpoint
    def rollout(self, task_names: list[str]) -> dict[str, Any]:
        """Roll out ``task_names[rank % len]``; returns the `RolloutResult` as a dict."""
        from dataclasses import asdict

        from composer_replication.datagen.rollout import run_rollout
        from composer_replication.datagen.sandbox import make_sandbox
        from composer_replication.datagen.tasks import bundled_tasks

        rank = current_rank().rank
        task = bundled_tasks()[task_names[rank % len(task_names)]]
        result = run_rollout(
            task,
            self._policy_for(task),
            rollout_id=f"{task.name}-r{rank}",
            log_dir=self.out_dir / "sessions",
            sandbox_factory=lambda: make_sandbox(self.sandbox_type),
        )
        return asdict(result) | {"pid": os.getpid()}


class ReplayWorker(Actor):
    """Ingests rollout session logs into states and replays them to teachers (under a dollar cap)."""

    @endpoint
    async def ingest_and_replay(
        self,
        session_logs: list[str],
        teachers: list[dict[str, Any]],
        max_total_usd: float = 0.0,
        max_tokens: int = 64,
    ) -> dict[str, Any]:
        from composer_replication.ingestion.claude_code import ClaudeCodeIngester
        from composer_replication.teacher_replay import replay_trace

        ing = ClaudeCodeIngester()
        states = [s for p in session_logs for s in ing.ingest(Path(p))]
        calls = []
        if teachers and states:
            calls = await replay_trace(
                cast("list[TraceState]", states),
                cast("list[TeacherSpec]", teachers),
                max_total_usd=max_total_usd,
                max_tokens=max_tokens,
                progress=False,
            )
        return {"states": states, "teacher_calls": calls, "pid": os.getpid()}


class TrainerActor(Actor):
    """Holds the policy; one optimizer step of response cross-entropy on reward-1 actions (rejection sampling).

    The step is the offline trainer's own (``trainer.offline.batch_stepper``: ``compose_loss`` with only the CE
    channel on, clipping at 1.0, AdamW), over batches padded by ``encoding``.
    """

    def __init__(self, model_dir: str, lr: float = 1e-3) -> None:
        import torch

        from composer_replication.models import load_model_and_tokenizer
        from composer_replication.trainer.offline.batch_stepper import batch_config, batch_stepper

        torch.manual_seed(0)
        self.model, self.tokenizer = load_model_and_tokenizer(model_dir)
        self._next: list[dict[str, Any]] = []
        cfg = batch_config({
            "model": {"path": model_dir},
            "loss": {"sdpo": {"weight": 0.0}, "preference": {"weight": 0.0}},
            "optimizer": {"type": "adamw", "lr": lr, "weight_decay": 0.01, "grad_clip": 1.0},
            "schedule": {"max_steps": 1_000_000, "batch_size": 1},
        })  # fmt: skip
        # each train_step queues its one batch; the stepper takes it as its (only) micro-batch
        self.stepper = batch_stepper(cfg, self.model, self.tokenizer, iter(self._next.pop, None))

    def _batch(self, examples: list[dict[str, Any]], max_len: int = 512) -> dict[str, Any]:
        from composer_replication import encoding, wire

        tok = self.tokenizer
        seqs = []
        for ex in examples:
            tools = wire.trace_tool_schemas(ex)
            prompt = encoding.render_prompt_ids(tok, ex["messages"], tools)
            action = wire.response_text(tok, ex["student_action"], tools)
            ids, mask = encoding.encode_response(tok, prompt, action, max_len)
            n_resp = sum(mask)
            seqs.append((ids[: len(ids) - n_resp], ids[len(ids) - n_resp :]))
        input_ids, resp, attn = encoding.stack_prompt_response(seqs, encoding.pad_id(tok))
        return {"input_ids": input_ids, "response_mask": resp, "attention_mask": attn}

    @endpoint
    def train_step(self, examples: list[dict[str, Any]]) -> dict[str, float]:
        if not examples:
            return {"step": float(self.stepper.step_count), "examples": 0.0}
        batch = self._batch(examples)
        self._next.append(batch)
        self.model.train()
        row = self.stepper.step()
        return {
            "step": float(self.stepper.step_count),
            "loss": row["loss/lm_ce"],
            "grad_norm": row["grad_norm"],
            "tokens": float(batch["response_mask"].sum()),
            "examples": float(len(examples)),
        }

    @endpoint
    def save(self, path: str) -> str:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        return path


def run_pipeline_step(
    out_dir: str | Path,
    model_dir: str | Path,
    *,
    tasks: tuple[str, ...] = ("off_by_one", "fix_import"),
    rollout_procs: int = 2,
    policy_dir: str | Path | None = None,
    teachers: list[dict[str, Any]] | None = None,
    stop: Stop | None = None,
) -> dict[str, Any]:
    """Spawn local meshes and run one rollout -> ingest/replay -> train step. Returns what each stage did.

    ``policy_dir`` None rolls out with the tasks' oracle (scripted) policy, so the step has successes to
    learn from; pass the trainer's model dir to roll out the model itself. ``stop`` (a `safety.Stop` such
    as a `KillSwitch`) is polled between stages and fed the training step's metrics.
    """
    out_dir = Path(out_dir)
    stop = as_stop(stop)
    if (reason := stop()) is not None:
        raise KillSwitchTriggered(reason)
    workers = this_host().spawn_procs(per_host={"procs": rollout_procs})
    trainer_mesh = this_host().spawn_procs(per_host={"procs": 1})
    try:
        rollouts = workers.spawn(
            "rollout", RolloutWorker, str(out_dir), None, str(policy_dir) if policy_dir else None
        )
        replayers = workers.spawn("replay", ReplayWorker)
        trainer = trainer_mesh.spawn("trainer", TrainerActor, str(model_dir))

        results = list(rollouts.rollout.call(list(tasks)).get().values())
        if (reason := stop()) is not None:
            raise KillSwitchTriggered(reason)
        usable = [r for r in results if r["status"] != "infra_error"]
        logs = [r["session_log"] for r in usable]
        replay = replayers.slice(procs=0).ingest_and_replay.call_one(logs, teachers or [], 0.0, 32).get()
        passed = {r["rollout_id"] for r in usable if r["reward"] == 1.0}
        examples = [s for s in replay["states"] if s["trace_id"] in passed]
        if (reason := stop()) is not None:
            raise KillSwitchTriggered(reason)
        metrics = trainer.train_step.call_one(examples).get()
        stop.observe(step=metrics.get("step"), loss=metrics.get("loss"), grad_norm=metrics.get("grad_norm"))
        checkpoint = trainer.save.call_one(str(out_dir / "checkpoint")).get()
        if (reason := stop()) is not None:
            raise KillSwitchTriggered(reason)
        return {
            "rollouts": results,
            "states": len(replay["states"]),
            "teacher_calls": replay["teacher_calls"],
            "train": metrics,
            "checkpoint": checkpoint,
            "pids": {"rollout": sorted({r["pid"] for r in results}), "replay": replay["pid"]},
        }
    finally:
        workers.stop().get()
        trainer_mesh.stop().get()


__all__ = ["ReplayWorker", "RolloutWorker", "TrainerActor", "run_pipeline_step"]
