"""Offline training on ingested data (no rollouts): SFT CE + α·SDPO + β·DPO through ``compose_loss``.

``train_offline(config, out_dir=..., resume=False, stop=None) -> dict`` is the library
entry point (the ``train`` command and the pipeline call it). Per optimizer step it takes
``grad_accum`` micro-batches, each a batch of traces (assistant turns as SFT targets; error sites give
the hinted SDPO teacher) and a batch of preference pairs (reference log-probs computed once per pair
with the initial weights and cached in the checkpoint), and sums ``compose_loss(...).total / grad_accum``.

Writes to ``out_dir``: ``metrics.jsonl`` (append-only, one row per logged step, per-channel losses),
``checkpoints/step-*`` (atomic, every N steps and at the end), ``losses.png``, ``final_metrics.json``.
Resume restores model, optimizer, LR scheduler, both data streams, all RNG states and the TAID
schedule: in deterministic CPU mode the resumed loss trajectory is bit-identical.

``make_offline_stepper(config, model=None, ...) -> OfflineStepper`` (``trainer.offline.stepper``)
exposes the same step one at a time (``.model``, ``.step() -> metrics``,
``.state_dict()``): ``train_offline`` is built on it, and DiLoCo replicas with ``inner: offline`` call
it for their inner steps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from composer_replication import wire
from composer_replication.config import TrainConfig, build_config
from composer_replication.safety.stop import Stop, as_stop
from composer_replication.trainer import checkpoint as ckpt
from composer_replication.trainer import data as od
from composer_replication.trainer import pair_tokens
from composer_replication.trainer.evaluation.heldout import evaluate
from composer_replication.trainer.offline.stepper import OfflineStepper
from composer_replication.trainer.prepare import load_model, seed_everything

__all__ = ["train_offline"]


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop rows logged after the restored checkpoint: the resumed run recomputes them identically."""
    from composer_replication._io import read_jsonl, write_jsonl_atomic

    if path.exists():
        write_jsonl_atomic(path, [r for r in read_jsonl(path) if r.get("step", 0) <= step])


def train_offline(
    config: TrainConfig | dict,
    *,
    out_dir: str | Path,
    resume: bool = False,
    stop: Stop | Callable[[], str | None] | None = None,
    device: str | None = None,
) -> dict[str, float]:
    """Train on ``config.data`` (traces and/or pairs) and return the final metrics (see module docstring).

    ``stop`` (a `safety.Stop` such as a `KillSwitch`, or a callable) is consulted once per optimizer step
    (polled before the first, then observed with each step's loss and grad norm); on a reason the
    run checkpoints and raises ``KillSwitchTriggered(reason)`` (exit code 3 from the CLI).
    """
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    cfg = config if isinstance(config, TrainConfig) else build_config(config)
    try:
        with wire.use_format(cfg.data.wire_format):
            return _train(cfg, out_dir=out_dir, resume=resume, stop=stop, device=device)
    finally:  # determinism is process-global in torch: leave it as we found it
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def _prepare_out(out: Path, resume: bool, engine: Any) -> tuple[Path | None, Path]:
    """The checkpoint to resume from (None: a fresh run) and this rank's on-policy sample cache."""
    out.mkdir(parents=True, exist_ok=True)
    latest = ckpt.latest_checkpoint(out / "checkpoints") if resume else None
    if resume and latest is None and engine.is_main:
        (out / "metrics.jsonl").unlink(missing_ok=True)  # nothing to resume from: start clean
    if not resume and (out / "metrics.jsonl").exists():
        raise FileExistsError(f"{out} already holds a run (metrics.jsonl); pass resume=True or a new out_dir")
    samples = out / ("sdpo_samples.jsonl" if engine.is_main else f"sdpo_samples.rank{engine.rank}.jsonl")
    if latest is None:  # samples cached by an earlier run without a checkpoint may be from other weights
        samples.unlink(missing_ok=True)
    engine.barrier()  # every rank checked before rank 0 writes
    return latest, samples


class _Data:
    """The run's rows, split by episode (traces) and pair id into train and held-out, and the collator."""

    def __init__(self, cfg: TrainConfig, tok: Any, traces: list[dict], pairs: list[dict]) -> None:
        self.pairs = pairs
        # held out by episode (example_id): the bundled sessions are few but have many episodes each
        self.train_traces, self.eval_traces = od.split(
            traces, lambda r: str(r.get("example_id") or r.get("trace_id")), cfg.data.eval_fraction
        )
        pid = lambda r: pair_tokens.pair_fields(r)[0]  # noqa: E731
        self.train_pairs, self.eval_pairs = od.split(self.pairs, pid, cfg.data.eval_fraction)
        d = cfg.data
        self.collator = (
            od.make_collator(
                tok, d.max_seq_len, d.max_dpo_seq_len, cfg.loss.sdpo.weight > 0, d.whole_responses
            )
            if traces
            else None
        )

    def evaluate(self, model: Any, tok: Any, cfg: TrainConfig, ref: Any) -> dict[str, float]:
        return evaluate(model, tok, cfg, self.eval_traces, self.eval_pairs, ref, self.collator)


def _save(
    engine: Any, stepper: OfflineStepper, model: Any, cfg: TrainConfig, ckpt_dir: Path, at: int
) -> Path:
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    state = {**stepper.state_dict(), "step": at, "rng": ckpt.rng_state(), "model_dtype": dtype}
    return engine.save(
        ckpt_dir, at, state, model=model, optimizer=stepper.opt, keep_last=cfg.checkpoint.keep_last
    )


def _steps(
    cfg: TrainConfig, stepper: OfflineStepper, engine: Any, stop: Stop, out: Path, save: Callable[[int], Path]
) -> int:
    """Run optimizer steps to ``max_steps``, logging and checkpointing; the step reached.

    One consult of the stop per optimizer step: polled before the first; after each step (logged and
    checkpointed), observe (feed its metrics, then poll) decides whether the next one runs.
    """
    from composer_replication._io import JsonlAppender
    from composer_replication.trainer.distributed import engine as distributed
    from composer_replication.trainer.trackers import open_trackers

    main = engine.is_main  # rank 0 writes every file but the checkpoints' shards
    trackers = open_trackers(cfg.logging.report_to, out, cfg.model_dump(mode="json")) if main else []
    metrics_log = JsonlAppender(out / "metrics.jsonl") if main else distributed.NullLog()
    step, max_steps = stepper.step_count, cfg.schedule.max_steps
    bar = None
    if cfg.logging.progress and main:
        from tqdm.auto import tqdm

        bar = tqdm(total=max_steps, initial=step, desc="train", unit="step")
    reason = stop() if step < max_steps else None
    try:
        while step < max_steps:
            reason = engine.agree(reason)  # every rank stops at the same step
            if reason is not None:
                save(step)
                from composer_replication.safety.kill_switch import KillSwitchTriggered

                raise KillSwitchTriggered(reason)
            metrics = stepper.step()
            step = stepper.step_count
            if step % cfg.logging.log_every == 0 or step == max_steps:
                row = {"step": step, **metrics}
                metrics_log.write(row)
                for tracker in trackers:
                    tracker.log(row, step)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{metrics['loss/total']:.4f}")
            if cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0:
                save(step)
            reason = stop.observe(step=step, loss=metrics["loss/total"], grad_norm=metrics["grad_norm"])
    finally:
        if bar is not None:
            bar.close()
        metrics_log.close()
        for tracker in trackers:
            tracker.close()
    return step


def _train(config, *, out_dir, resume, stop, device) -> dict[str, float]:
    from composer_replication._io import atomic_write_json
    from composer_replication.trainer.distributed import engine as distributed

    cfg = config if isinstance(config, TrainConfig) else build_config(config)
    stop = as_stop(stop)  # one Stop (a KillSwitch, or a plain callable polled)
    engine = distributed.setup(cfg, device)  # one process, or one rank of torchrun / --nproc N
    traces, pairs = od.load_data(cfg)  # a bad or empty file fails here, before out_dir is created
    out, main = Path(out_dir), engine.is_main
    ckpt_dir = out / "checkpoints"
    latest, samples = _prepare_out(out, resume, engine)
    seed_everything(cfg.seed, cfg.deterministic)
    model, tok = load_model(*engine.load_args(cfg))
    model = engine.prepare(model)
    model.train()
    data = _Data(cfg, tok, traces, pairs)
    stepper = OfflineStepper(
        cfg, model, tok, engine.device, train_traces=data.train_traces, train_pairs=data.train_pairs,
        ref_pairs=data.pairs, collator=data.collator, sample_cache=samples, engine=engine,
    )  # fmt: skip
    if latest is not None:
        engine.load(latest, stepper)
        if main:
            _truncate_metrics(out / "metrics.jsonl", stepper.step_count)
    else:
        initial = data.evaluate(engine.unsharded(model), tok, cfg, stepper.ref)
        if main:
            atomic_write_json(out / "initial_metrics.json", initial)

    def save(at: int) -> Path:
        return _save(engine, stepper, model, cfg, ckpt_dir, at)

    step = _steps(cfg, stepper, engine, stop, out, save)
    if ckpt.latest_checkpoint(ckpt_dir) is None or not (ckpt_dir / f"step-{step:08d}").exists():
        save(step)
    final = data.evaluate(engine.unsharded(model), tok, cfg, stepper.ref)
    final.update(step=step)
    if main:
        atomic_write_json(out / "final_metrics.json", final)
    if cfg.logging.plot and main:
        from composer_replication.trainer.plots import plot_losses

        plot_losses(out / "metrics.jsonl", out / "losses.png")
    return final
