"""`KillSwitchCallback`: feeds HF Trainer / TRL logs into a `Stop` (a `KillSwitch`) and stops training with a checkpoint.

On a trigger the callback sets ``control.should_save`` and ``control.should_training_stop``: the Trainer
writes a checkpoint (even under ``save_strategy="no"``) and leaves ``train()`` normally. The caller then
calls `KillSwitchCallback.raise_if_triggered` so the CLI exits with ``EXIT_KILL_SWITCH``::

    switch = KillSwitch(stop_file=run_dir / "STOP", log_path=run_dir / "kill_switch.jsonl")
    cb = KillSwitchCallback(switch)
    trainer = GRPOTrainer(..., callbacks=[cb])
    trainer.train()
    cb.raise_if_triggered()   # KillSwitchTriggered(reason), exit code 3

Log keys read (TRL GRPO and HF Trainer names): ``loss``, ``grad_norm``, ``kl``, ``reward``; a spend
figure under ``spend_usd`` if a callback upstream logs one. Set ``logging_steps=1`` so every step is seen.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from composer_replication.safety.kill_switch import KillSwitchTriggered
from composer_replication.safety.stop import Stop, as_stop

_KEYS = {"loss": "loss", "grad_norm": "grad_norm", "kl": "kl", "reward": "reward", "spend_usd": "spend_usd"}


def agree_reason(reason: str | None) -> str | None:
    """Across the processes of a run (``accelerate launch``): the first rank's reason if any rank has
    one, so that every rank stops at the same step. A collective: every rank calls it at the same hook."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return reason
    reasons: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reasons, reason)
    return next((r for r in reasons if r is not None), None)


class KillSwitchCallback(TrainerCallback):
    """Polls ``stop`` after every step and every log; on a reason, checkpoint and stop (module docstring)."""

    def __init__(self, stop: Stop) -> None:
        self.stop = as_stop(stop)
        self.reason: str | None = None
        self.checkpoint_step: int | None = None

    def _stop(self, reason: str, state: TrainerState, control: TrainerControl) -> TrainerControl:
        if self.reason is None:
            self.reason = reason
            self.checkpoint_step = state.global_step
        control.should_save = True
        control.should_training_stop = True
        return control

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any):
        # several processes (accelerate launch): every rank stops at the same step, or none does
        if (reason := agree_reason(self.stop())) is not None:
            return self._stop(reason, state, control)
        return control

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kw: Any
    ):
        metrics = {k: logs[src] for src, k in _KEYS.items() if logs and src in logs}
        reason = self.stop.observe(step=state.global_step, **metrics) or self.stop()
        if (reason := agree_reason(reason)) is not None:
            return self._stop(reason, state, control)
        return control

    def raise_if_triggered(self) -> None:
        """Raise `KillSwitchTriggered` if training was stopped by the switch."""
        if self.reason is not None:
            raise KillSwitchTriggered(self.reason)
