"""One offline optimizer step at a time: :class:`OfflineStepper` and :func:`make_offline_stepper`.

Each step takes ``grad_accum`` micro-batches of traces and preference pairs and sums
``compose_loss(...).total / grad_accum`` (SFT CE + α·SDPO + β·DPO; on-policy SDPO samples at error sites).
:func:`composer_replication.trainer.offline.loop.train_offline` runs these steps with checkpoints, metrics
and the kill switch; DiLoCo replicas with ``inner: offline`` call them for their inner steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from composer_replication.config import TrainConfig, build_config
from composer_replication.loss import ComposedLoss
from composer_replication.trainer import checkpoint as ckpt
from composer_replication.trainer import data as od
from composer_replication.trainer import pair_tokens
from composer_replication.trainer.pair_tokens import pair_batch
from composer_replication.trainer.prepare import load_model, make_optimizer, make_taid


class OfflineStepper:
    """One optimizer step at a time over the offline data streams (what ``train_offline`` and DiLoCo replicas run).

    Holds the model, tokenizer, optimizer, LR schedule, the trace and pair streams, the TAID schedule
    and the cached reference log-probs. :meth:`step` takes ``grad_accum`` micro-batches, sums
    ``compose_loss(...).total / grad_accum``, clips, steps and returns the per-channel metrics
    (``loss/<channel>``, channel extras, ``grad_norm``, ``lr``, ``taid_t``). ``state_dict`` /
    ``load_state_dict`` cover everything but the global RNG state (``checkpoint.rng_state``).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        model: Any,
        tok: Any,
        device: torch.device,
        *,
        train_traces: list[dict],
        train_pairs: list[dict],
        ref_pairs: list[dict] | None = None,
        collator: Any = None,
        sample_cache: Path | None = None,
        engine: Any = None,
    ) -> None:
        from composer_replication.trainer.distributed.engine import Engine

        self.cfg, self.model, self.tok, self.device = cfg, model, tok, device
        self.engine = engine or Engine(device)  # several processes: trainer.distributed.engine
        self.step_count = 0
        bs = cfg.schedule.batch_size
        use_pairs = bool(train_pairs) and cfg.loss.preference.weight > 0
        shard = self.engine.stream
        self.trace_stream = shard(od.Stream(train_traces, bs, cfg.seed)) if train_traces else None
        self.pair_stream = shard(od.Stream(train_pairs, bs, cfg.seed + 1)) if use_pairs else None
        if collator is None and train_traces:
            collator = od.make_collator(
                tok, cfg.data.max_seq_len, cfg.data.max_dpo_seq_len, cfg.loss.sdpo.weight > 0,
                cfg.data.whole_responses,
            )  # fmt: skip
        self.collator = collator
        self.on_policy = None
        if cfg.loss.sdpo.source == "on_policy" and cfg.loss.sdpo.weight > 0 and train_traces:
            from composer_replication.trainer.error_sites import error_sites
            from composer_replication.trainer.offline.onpolicy import OnPolicySDPO

            sites = error_sites(train_traces)
            if sites:  # without a failed tool call there is nothing to distil (as with source: recorded)
                self.on_policy = OnPolicySDPO(tok, sites, cfg, cfg.seed, sample_cache)
                self.on_policy.stream = self.engine.stream(self.on_policy.stream)  # each rank its own sites
        self._ref_pairs = train_pairs if ref_pairs is None else ref_pairs
        self._ref: dict[str, tuple] | None = None
        self.opt, self.sched = make_optimizer(cfg, model)
        self.taid = make_taid(cfg)
        self.loss = ComposedLoss.from_config(cfg.loss)

    @property
    def ref(self) -> dict[str, tuple]:
        """Reference log-probs per pair id, computed on first use with the weights at that moment."""
        if self._ref is None:
            pairs = self._ref_pairs
            self._ref = (
                self.engine.reference_logprobs(self.model, self.tok, pairs, self.cfg.data.max_dpo_seq_len)
                if pairs
                else {}
            )
        return self._ref

    def _micro_batch(self) -> dict[str, torch.Tensor]:
        cfg, dev = self.cfg, self.device
        batch: dict[str, torch.Tensor] = {}
        if self.trace_stream is not None:
            batch.update(
                {
                    k: v.to(dev)
                    for k, v in od.trace_batch(self.collator, self.trace_stream.next_batch()).items()
                }
            )
        if self.pair_stream is not None:
            batch.update(
                pair_batch(self.tok, self.pair_stream.next_batch(), self.ref, cfg.data.max_dpo_seq_len, dev)
            )
        if "input_ids" not in batch:  # pairs only: the CE channel trains on the chosen responses
            batch["input_ids"] = batch["dpo_chosen_input_ids"]
            batch["response_mask"] = batch["dpo_chosen_response_mask"]
        return batch

    def step(self) -> dict[str, float]:
        """One optimizer step over the next ``grad_accum`` batches; returns its metrics."""
        cfg, ga = self.cfg, self.cfg.schedule.grad_accum
        if self.pair_stream is not None:
            _ = self.ref  # computed before the first update: the reference is the initial policy
        self.opt.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        extras: dict[str, float] = {}
        taid_t = self.taid.t if self.taid is not None else None
        for i in range(ga):  # gradients are synchronised across processes on the last micro-batch
            batch, call = self._micro_batch(), {"taid_t": taid_t}
            metrics: dict[str, float] = {}
            if self.on_policy is not None:  # the SDPO channel's rows: the student's samples at error sites
                call["sdpo_inputs"], metrics = self._on_policy_batch(i)
            comps = self.engine.loss(self.model, batch, self.loss, sync=i == ga - 1, **call)
            parts = comps.detached()
            metrics.update(comps.metrics)
            (comps.total / ga).backward()
            for k, v in parts.items():
                totals[k] = totals.get(k, 0.0) + v / ga
            for k, v in metrics.items():
                if not k.endswith("/loss"):  # the /loss values duplicate loss/<channel>
                    extras[k] = extras.get(k, 0.0) + v / ga
        totals, extras = self.engine.mean(totals), self.engine.mean(extras)  # over processes
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = self.engine.clip_grad_norm(params, cfg.optimizer.grad_clip)
        self.opt.step()
        self.sched.step()
        self.step_count += 1
        if self.taid is not None:
            self.taid.update_t(totals["sdpo_jsd"], global_step=self.step_count)
        row = {f"loss/{k}": v for k, v in totals.items()}
        row.update(extras, grad_norm=float(grad_norm), lr=self.sched.get_last_lr()[0])
        if self.taid is not None:
            row["taid_t"] = self.taid.t
        return row

    def _on_policy_batch(self, micro: int) -> tuple[dict[str, torch.Tensor] | None, dict[str, float]]:
        """The student's samples at this micro-batch's error sites (None: no site) and the sampling metrics."""
        assert self.on_policy is not None
        # keyed by the global micro-batch index: rank r's i-th is one process's (i * world + r)-th
        # (``RankStream``), so N processes draw the samples of one process at grad_accum N * g
        world = self.engine.world_size
        batch, metrics = self.on_policy.batch(self.model, self.step_count, micro * world + self.engine.rank)
        return (None if batch is None else {k: v.to(self.device) for k, v in batch.items()}), metrics

    def skip_to(self, step: int) -> None:
        """Advance the data streams and LR schedule to ``step`` without training (a replica catching up)."""
        import warnings

        while self.step_count < step:
            for _ in range(self.cfg.schedule.grad_accum):
                for stream in (self.trace_stream, self.pair_stream):
                    if stream is not None:
                        stream.next_batch()
                if self.on_policy is not None:
                    self.on_policy.stream.next_batch()
            with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": intended here
                warnings.simplefilter("ignore")
                self.sched.step()
            self.step_count += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step_count,
            "model": ckpt.trainable_state(self.model),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "trace_stream": self.trace_stream.state_dict() if self.trace_stream else None,
            "pair_stream": self.pair_stream.state_dict() if self.pair_stream else None,
            "taid": self.taid.state_dict() if self.taid is not None else None,
            "on_policy": self.on_policy.state_dict() if self.on_policy is not None else None,
            "ref_logprobs": self.ref,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ckpt.restore_model(self.model, state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self._ref = state["ref_logprobs"]
        if self.trace_stream is not None:
            self.trace_stream.load_state_dict(state["trace_stream"])
        if self.pair_stream is not None:
            self.pair_stream.load_state_dict(state["pair_stream"])
        if self.taid is not None:
            self.taid.load_state_dict(state["taid"])
        if self.on_policy is not None:
            self.on_policy.load_state_dict(state["on_policy"])
        self.step_count = state["step"]


def make_offline_stepper(
    config: TrainConfig | dict,
    *,
    model: Any | None = None,
    tokenizer: Any | None = None,
    device: str | None = None,
    shard: tuple[int, int] | None = None,
) -> OfflineStepper:
    """An :class:`OfflineStepper` on ``config.data`` (the training split; held-out rows are left out).

    ``model``/``tokenizer`` default to :func:`load_model` (seeded by ``config.seed``, so every caller
    gets the same initial weights). ``shard=(rank, world_size)`` keeps every ``world_size``-th training
    row from ``rank`` on, per stream (DiLoCo replicas each train on their own slice).
    """
    cfg = config if isinstance(config, TrainConfig) else build_config(config)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if model is None:
        model, loaded_tok = load_model(cfg, dev)
        tokenizer = tokenizer or loaded_tok
    elif tokenizer is None:
        raise ValueError("make_offline_stepper(model=...) needs tokenizer=... too")
    model.train()
    traces, _ = od.split(
        od.load_rows(cfg.data.traces),
        lambda r: str(r.get("example_id") or r.get("trace_id")),
        cfg.data.eval_fraction,
    )
    pairs, _ = od.split(
        od.load_rows(cfg.data.pairs), lambda r: pair_tokens.pair_fields(r)[0], cfg.data.eval_fraction
    )
    if shard is not None:
        rank, world = shard
        traces, pairs = traces[rank::world], pairs[rank::world]
        if not traces and not pairs:
            raise ValueError(
                f"shard {rank} of {world} has no training rows in {cfg.data.traces} / {cfg.data.pairs}: "
                "add data or use fewer replicas"
            )
    return OfflineStepper(cfg, model, tokenizer, dev, train_traces=traces, train_pairs=pairs)
