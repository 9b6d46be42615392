"""What one DiLoCo replica runs, on any backend: config in; inner steps; outer syncs; logs and checkpoints out.

Run as ``python -m composer_replication.diloco.serverless.replica_entrypoint --config CONFIG
--rank R --world-size N`` (the rank falls back to ``$JOB_COMPLETION_INDEX`` on Kubernetes, then
``$REPLICA_RANK``/``$RANK``), or call :func:`run_replica` in-process (Modal ``.local()``).

Outer syncs go through the object-store all-reduce (``sync: object_store``, any backend) or through
torchft (``sync: torchft``, when replicas can reach a lighthouse). After every round the global
state (parameters and outer momentum) is published create-only under ``<run>/state/``: a replica
that restarts, or falls behind, adopts the newest state instead of replaying rounds.

Inner steps (``inner``): ``lm_ce`` (default) is a language-model cross-entropy loop on the
configured tiny model and synthetic data, through ``composer_replication.loss.token_logprobs``;
``offline`` runs the offline trainer's steps (SFT CE + α·SDPO + β·DPO through ``compose_loss``) via
:func:`composer_replication.trainer.offline.make_offline_stepper` on the ``offline`` section (a
``TrainConfig``), each replica on its own shard (``rank::world_size``) of the training rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "ReplicaConfig",
    "run_replica",
    "build_replica",
    "build_inner",
    "inner_steps",
    "make_batch",
    "main",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Strict):
    arch: Literal["qwen2", "llama"] = "qwen2"
    vocab_size: int = Field(512, ge=16)
    hidden_size: int = Field(32, ge=8)
    intermediate_size: int = Field(64, ge=8)
    num_hidden_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    seed: int = 0


class DataConfig(_Strict):
    type: Literal["synthetic"] = "synthetic"
    seq_len: int = Field(16, ge=2)
    batch_size: int = Field(4, ge=1)
    seed: int = 0


class TorchftConfig(_Strict):
    lighthouse: str = Field(..., description="lighthouse URL, e.g. http://127.0.0.1:29510")
    hostname: str = "127.0.0.1"
    min_replica_size: int = Field(1, ge=1)
    timeout_s: float = Field(10.0, gt=0)


class ReplicaConfig(_Strict):
    """The resolved config every replica gets (validated; unknown keys are errors)."""

    run_id: str = Field("diloco", pattern=r"^[A-Za-z0-9._-]+$")
    run_dir: str | None = Field(None, description="local directory for logs, checkpoints and results")
    sync: Literal["object_store", "torchft"] = "object_store"
    store: dict[str, Any] | None = Field(
        None, description='{"type": "local", "root": ...} or {"type": "s3", ...}'
    )
    torchft: TorchftConfig | None = None
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rounds: int = Field(3, ge=1, description="outer rounds (object_store) ")
    inner_steps: int = Field(4, ge=1, description="H: inner steps per outer round")
    inner_lr: float = Field(1e-3, gt=0)
    outer_lr: float = Field(0.7, gt=0)
    outer_momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = True
    min_participants: int = Field(1, ge=1)
    deadline_s: float = Field(30.0, gt=0, description="grace before a round closes without everyone")
    timeout_s: float = Field(600.0, gt=0)
    step_sleep_s: float = Field(0.0, ge=0, description="pause after each inner step (tests pace replicas)")
    num_threads: int = Field(1, ge=1, description="torch intra-op threads; 1 makes runs bit-reproducible")
    inner: Literal["lm_ce", "offline"] = Field(
        "lm_ce",
        description="lm_ce: CE on synthetic tokens; offline: the offline trainer's three-channel step",
    )
    offline: dict[str, Any] | None = Field(
        None, description="for inner: offline, an offline TrainConfig (docs/training.md); model/data ignored"
    )

    @model_validator(mode="after")
    def _sync_needs_its_section(self) -> ReplicaConfig:
        if self.sync == "object_store" and self.store is None:
            raise ValueError(
                "sync: object_store needs a `store` section, e.g. {type: local, root: /shared/dir} "
                "or {type: s3, bucket: NAME, prefix: diloco}"
            )
        if self.sync == "torchft" and self.torchft is None:
            raise ValueError("sync: torchft needs a `torchft` section with `lighthouse: http://HOST:PORT`")
        if self.inner == "offline":
            if self.offline is None:
                raise ValueError(
                    "inner: offline needs an `offline` section: a TrainConfig such as "
                    "{model: {path: tiny}, data: {traces: traces.jsonl, pairs: pairs.jsonl}}"
                )
            if self.sync == "torchft":
                raise ValueError(
                    "inner: offline runs with sync: object_store only (torchft uses inner: lm_ce)"
                )
            self.offline_train_config()  # a bad section fails here, before anything is launched
        elif self.offline is not None:
            raise ValueError("an `offline` section needs inner: offline")
        return self

    def offline_train_config(self) -> Any:
        """The ``offline`` section as a ``TrainConfig``; ``schedule.max_steps`` defaults to rounds × H."""
        from composer_replication.config import build_config

        data = json.loads(json.dumps(self.offline or {}))
        data.setdefault("schedule", {}).setdefault("max_steps", self.rounds * self.inner_steps)
        return build_config(data, source="offline")


def _loss_fn() -> Any:
    try:  # the shared loss seam, when the losses module is present
        from composer_replication.loss import token_logprobs

        return token_logprobs
    except ImportError:

        def token_logprobs(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(logits_BTV.float(), -1).gather(-1, labels_BT.unsqueeze(-1)).squeeze(-1)

        return token_logprobs


def make_batch(cfg: ReplicaConfig, *, rank: int, round_index: int, step: int) -> torch.Tensor:
    """Deterministic, learnable token sequences (arithmetic progressions mod V) for (rank, round, step)."""
    d, v = cfg.data, cfg.model.vocab_size
    g = torch.Generator().manual_seed(
        ((d.seed * 1_000_003 + rank) * 1_000_003 + round_index) * 1_000_003 + step
    )
    start = torch.randint(0, v, (d.batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (d.batch_size, 1), generator=g)
    return (start + stride * torch.arange(d.seq_len)) % v


def build_replica(cfg: ReplicaConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model (same initial weights on every replica) and its inner AdamW."""
    from composer_replication.models import build_tiny_model

    m = cfg.model
    model = build_tiny_model(
        m.vocab_size,
        arch=m.arch,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads,
        seed=m.seed,
    )
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=cfg.inner_lr, betas=(0.9, 0.95), weight_decay=0.1)


def inner_step(
    cfg: ReplicaConfig, model: torch.nn.Module, opt: torch.optim.Optimizer, batch_BT: torch.Tensor
) -> float:
    """One inner optimizer step of next-token cross-entropy; returns the loss."""
    logits_BTV = model(input_ids=batch_BT[:, :-1]).logits
    loss = -_loss_fn()(logits_BTV, batch_BT[:, 1:]).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if cfg.step_sleep_s:
        time.sleep(cfg.step_sleep_s)
    return float(loss.detach())


def inner_steps(
    cfg: ReplicaConfig, model: torch.nn.Module, opt: torch.optim.Optimizer, *, rank: int, round_index: int
) -> float:
    """H inner steps of round ``round_index``; returns their mean loss."""
    losses = [
        inner_step(cfg, model, opt, make_batch(cfg, rank=rank, round_index=round_index, step=h))
        for h in range(cfg.inner_steps)
    ]
    return sum(losses) / len(losses)


class _LmCeInner:
    """``inner: lm_ce``: the tiny model, its AdamW, and batches that are a function of (rank, round, step)."""

    def __init__(self, cfg: ReplicaConfig, rank: int) -> None:
        self.cfg, self.rank = cfg, rank
        self.model, self.opt = build_replica(cfg)

    def run_round(self, round_index: int) -> dict[str, Any]:
        return {"loss": inner_steps(self.cfg, self.model, self.opt, rank=self.rank, round_index=round_index)}


class _OfflineInner:
    """``inner: offline``: the offline trainer's stepper on this replica's shard of the data."""

    def __init__(self, cfg: ReplicaConfig, rank: int, world_size: int) -> None:
        from composer_replication.trainer.offline import make_offline_stepper

        self.cfg = cfg
        self.stepper = make_offline_stepper(cfg.offline_train_config(), shard=(rank, world_size))
        self.model = self.stepper.model

    def run_round(self, round_index: int) -> dict[str, Any]:
        # a replica that adopted a later global state skips the batches of the rounds it missed
        self.stepper.skip_to(round_index * self.cfg.inner_steps)
        rows = []
        for _ in range(self.cfg.inner_steps):
            rows.append(self.stepper.step())
            if self.cfg.step_sleep_s:
                time.sleep(self.cfg.step_sleep_s)
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        return {"loss": mean["loss/total"], "metrics": mean}


def build_inner(cfg: ReplicaConfig, *, rank: int, world_size: int) -> _LmCeInner | _OfflineInner:
    """The inner loop for ``cfg.inner``: ``.model`` and ``.run_round(r) -> {"loss", ["metrics"]}``."""
    if cfg.inner == "offline":
        return _OfflineInner(cfg, rank, world_size)
    return _LmCeInner(cfg, rank)


class _Log:
    """Append-only JSONL metrics in ``run_dir`` and a one-line status the launcher shows."""

    def __init__(self, cfg: ReplicaConfig, rank: int) -> None:
        from composer_replication._io import JsonlAppender

        self.rank = rank
        self.dir = Path(cfg.run_dir) if cfg.run_dir else None
        self.metrics = JsonlAppender(self.dir / f"replica-{rank}.metrics.jsonl") if self.dir else None

    def __call__(self, **record: Any) -> None:
        record = {"rank": self.rank, "time": round(time.time(), 3), **record}
        print(json.dumps(record), flush=True)
        if self.metrics is not None:
            self.metrics.write(record)


def _latest_state(store: Any, run_id: str, at_least: int) -> tuple[int, dict[str, torch.Tensor]] | None:
    """The newest published global state if it is for round ``at_least`` or later (else None)."""
    from safetensors.torch import load

    keys = store.list(f"{run_id}/state/")
    if not keys or int(keys[-1].rsplit("/", 1)[1].split(".")[0]) < at_least:
        return None
    data, _ = store.get(keys[-1])
    return int(keys[-1].rsplit("/", 1)[1].split(".")[0]), load(data)


def _run_object_store(cfg: ReplicaConfig, rank: int, world_size: int, log: _Log) -> dict[str, Any]:
    from safetensors.torch import save

    from composer_replication.diloco.serverless.allreduce import object_store_allreduce
    from composer_replication.diloco.serverless.simulate import OuterOptimizer, params_sha256, pseudo_gradient
    from composer_replication.diloco.serverless.store import make_store

    if cfg.store is None:
        raise ValueError(
            "sync: object_store needs a `store` ({'type': 'local', 'root': ...} or {'type': 's3', ...})"
        )
    store = make_store(cfg.store)
    inner = build_inner(cfg, rank=rank, world_size=world_size)
    model = inner.model
    outer = OuterOptimizer(
        dict(model.named_parameters()), lr=cfg.outer_lr, momentum=cfg.outer_momentum, nesterov=cfg.nesterov
    )
    history: list[dict[str, Any]] = []
    r = 0
    while r < cfg.rounds:
        latest = _latest_state(store, cfg.run_id, at_least=r)
        if latest is not None:  # restarted or behind: adopt the newest global state
            outer.load_state_tensors(latest[1])
            log(event="adopt", round=latest[0], param_sha256=params_sha256(outer.params))
            r = latest[0] + 1
            continue
        outer.load_into(model)
        out = inner.run_round(r)
        res = object_store_allreduce(
            store,
            pseudo_gradient(outer.params, model),
            run_id=cfg.run_id,
            round_index=r,
            rank=rank,
            world_size=world_size,
            min_participants=cfg.min_participants,
            deadline_s=cfg.deadline_s,
            timeout_s=cfg.timeout_s,
        )
        outer.step(res.tensors)
        state = save({k: v.contiguous() for k, v in outer.state_tensors().items()})
        store.put_if_absent(f"{cfg.run_id}/state/{r:06d}.safetensors", state)
        row = {
            "round": r,
            "loss": out["loss"],
            **({"metrics": out["metrics"]} if "metrics" in out else {}),
            "participants": res.participants,
            "included": res.included,
            "rejected": {str(k): v for k, v in res.rejected.items()},
            "allreduce_s": round(res.seconds, 4),
            "param_sha256": params_sha256(outer.params),
        }
        log(event="sync", step=(r + 1) * cfg.inner_steps, **row)
        history.append(row)
        r += 1
    outer.load_into(model)
    return {"rank": rank, "rounds": history, "param_sha256": params_sha256(outer.params)}


def run_replica(config: dict[str, Any] | ReplicaConfig, *, rank: int, world_size: int) -> dict[str, Any]:
    """Run one replica to completion and return a JSON-able summary (also written to ``run_dir``)."""
    cfg = config if isinstance(config, ReplicaConfig) else ReplicaConfig.model_validate(config)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    torch.set_num_threads(cfg.num_threads)
    log = _Log(cfg, rank)
    log(event="start", world_size=world_size, sync=cfg.sync, pid=os.getpid())
    if cfg.sync == "torchft":
        from composer_replication.diloco.torchft_replica import run_torchft_replica

        result = run_torchft_replica(cfg, rank=rank, world_size=world_size, log=log)
    else:
        result = _run_object_store(cfg, rank, world_size, log)
    log(event="done", param_sha256=result["param_sha256"])
    if cfg.run_dir:
        from composer_replication._io import atomic_write_json

        atomic_write_json(Path(cfg.run_dir) / f"replica-{rank}.result.json", result)
    return result


def _load_config(path: str) -> dict[str, Any]:
    text = Path(path).read_text()
    if path.endswith((".yaml", ".yml")):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)


def _env_rank() -> int | None:
    for var in ("JOB_COMPLETION_INDEX", "REPLICA_RANK", "RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run one DiLoCo replica.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="resolved config, JSON or YAML")
    src.add_argument("--config-json", help="resolved config as an inline JSON string")
    p.add_argument(
        "--rank", type=int, default=None, help="default: $JOB_COMPLETION_INDEX, $REPLICA_RANK, $RANK"
    )
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    p.add_argument("--result-file", help="write the JSON summary here too")
    p.add_argument(
        "--entrypoint",
        default="composer_replication.diloco.serverless.replica_entrypoint:run_replica",
        help="'module:function' called as function(config, rank=, world_size=)",
    )
    args = p.parse_args(argv)
    config = _load_config(args.config) if args.config else json.loads(args.config_json)
    rank = args.rank if args.rank is not None else _env_rank()
    if rank is None:
        p.error("no --rank and none of $JOB_COMPLETION_INDEX, $REPLICA_RANK, $RANK is set")
    from composer_replication.diloco.serverless.executor import resolve_entrypoint

    result = resolve_entrypoint(args.entrypoint)(config, rank=rank, world_size=args.world_size)
    if args.result_file:
        from composer_replication._io import atomic_write_json

        atomic_write_json(args.result_file, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
