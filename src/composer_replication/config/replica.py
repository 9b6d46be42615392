"""The DiLoCo replica config: one pydantic schema every replica gets, and its loader.

Every backend ships the same resolved config to its replicas (``composer-replication launch``
validates it first; each replica validates it again). Unknown keys are errors; a sync mode without
its section (``object_store`` without ``store``, ``torchft`` without ``torchft``) and a bad
``offline`` section are rejected when the config is loaded, before anything is launched.

Importable without torch. The classes carry a ``Replica`` prefix so they never clash with the
training config's (``config.train.ModelConfig``/``DataConfig``); loading goes through the one loader
(``config.base.load_file``) and every error is a ``ConfigError`` naming the file and each bad field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from composer_replication.config.base import StrictModel, load_file, validate

__all__ = [
    "ReplicaConfig",
    "ReplicaModelConfig",
    "ReplicaDataConfig",
    "ReplicaTorchftConfig",
    "LocalStoreConfig",
    "S3StoreConfig",
    "StoreConfig",
    "parse_replica_config",
    "load_replica_config",
]

DOCS = "docs/diloco.md"


class ReplicaModelConfig(StrictModel):
    """The tiny model the ``lm_ce`` inner loop trains (same seed, same initial weights everywhere)."""

    arch: Literal["qwen2", "llama"] = "qwen2"
    vocab_size: int = Field(512, ge=16)
    hidden_size: int = Field(32, ge=8)
    intermediate_size: int = Field(64, ge=8)
    num_hidden_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    seed: int = 0


class ReplicaDataConfig(StrictModel):
    """Synthetic token batches for ``lm_ce``: a pure function of (seed, rank, round, step)."""

    type: Literal["synthetic"] = "synthetic"
    seq_len: int = Field(16, ge=2)
    batch_size: int = Field(4, ge=1)
    seed: int = 0


class ReplicaTorchftConfig(StrictModel):
    """Where the torchft lighthouse is and how long to wait for a quorum."""

    lighthouse: str = Field(..., description="lighthouse URL, e.g. http://127.0.0.1:29510")
    hostname: str = "127.0.0.1"
    min_replica_size: int = Field(1, ge=1)
    timeout_s: float = Field(10.0, gt=0)


class LocalStoreConfig(StrictModel):
    """A directory on this machine or on a POSIX shared file system."""

    type: Literal["local"]
    root: str


class S3StoreConfig(StrictModel):
    """A bucket on S3 or an S3-compatible server; credentials come from the AWS chain, never from here."""

    type: Literal["s3"]
    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    create_bucket: bool = False


StoreConfig = Annotated[LocalStoreConfig | S3StoreConfig, Field(discriminator="type")]


class ReplicaConfig(StrictModel):
    """The resolved config every replica gets (validated; unknown keys are errors)."""

    run_id: str = Field("diloco", pattern=r"^[A-Za-z0-9._-]+$")
    run_dir: str | None = Field(None, description="local directory for logs, checkpoints and results")
    sync: Literal["object_store", "torchft"] = "object_store"
    store: StoreConfig | None = Field(None, description="{type: local, root: ...} or {type: s3, bucket: ...}")
    torchft: ReplicaTorchftConfig | None = None
    model: ReplicaModelConfig = ReplicaModelConfig()
    data: ReplicaDataConfig = ReplicaDataConfig()
    rounds: int = Field(3, ge=1, description="outer rounds")
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
        from composer_replication.config.train import build_config

        data = json.loads(json.dumps(self.offline or {}))
        data.setdefault("schedule", {}).setdefault("max_steps", self.rounds * self.inner_steps)
        return build_config(data, source="offline")


def parse_replica_config(
    data: Mapping[str, Any] | ReplicaConfig, *, source: str = "<config>"
) -> ReplicaConfig:
    """Validate a mapping (or pass a ``ReplicaConfig`` through); ``ConfigError`` names each bad field."""
    if isinstance(data, ReplicaConfig):
        return data
    return validate(ReplicaConfig, data, source=source, docs=DOCS)


def load_replica_config(path: str | Path) -> ReplicaConfig:
    """Load and validate a replica config from YAML, TOML or JSON."""
    return load_file(path, ReplicaConfig, docs=DOCS)
