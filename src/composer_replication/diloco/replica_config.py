"""The replica config's former path: the schema and its loader live in ``composer_replication.config.replica``."""

from composer_replication.config.replica import (
    LocalStoreConfig,
    ReplicaConfig,
    ReplicaDataConfig,
    ReplicaModelConfig,
    ReplicaTorchftConfig,
    S3StoreConfig,
    StoreConfig,
    load_replica_config,
    parse_replica_config,
)

__all__ = [
    "LocalStoreConfig",
    "ReplicaConfig",
    "ReplicaDataConfig",
    "ReplicaModelConfig",
    "ReplicaTorchftConfig",
    "S3StoreConfig",
    "StoreConfig",
    "load_replica_config",
    "parse_replica_config",
]
