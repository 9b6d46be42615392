"""Every config tree of the project, on one strict base and one loader.

- ``config.base``: ``StrictModel`` (unknown keys are errors), ``load_file`` (YAML/TOML/JSON + dotted
  overrides), ``ConfigError`` (names the file and each bad field).
- ``config.presets``: named presets as plain data (``PO_OBJECTIVES``).
- ``config.loss``: the ``loss`` section; SDPO and preference variants chosen by ``type``.
- ``config.train``: the trainer's ``TrainConfig`` (``load_config``, ``build_config``).
- ``config.run``: the pipeline's ``RunConfig`` (``load_run_config``), which embeds the trainer's fields.
- ``config.sections``: ``RunConfig``'s sections (sources, replay and its defaults, pairs, evaluate, ...).
- ``config.tasks``: the run's ``tasks`` section (``TasksConfig``): tasks from your sessions, before/after.
- ``config.replica``: the DiLoCo replica's ``ReplicaConfig`` (``load_replica_config``).

Importable without torch, and imports nothing from the rest of the package: every other layer builds on
it. The names below are the public paths (``composer_replication.config.TrainConfig``, ...).
"""

from __future__ import annotations

from composer_replication.config.base import (
    ConfigError,
    StrictModel,
    check_base_url,
    format_validation_error,
    load_file,
    read_config_file,
    set_dotted,
)
from composer_replication.config.loss import (
    GJSDSDPO,
    TAIDSDPO,
    DPOPreference,
    EntropyOPDSDPO,
    LossConfig,
    OnPolicyConfig,
    PreferenceConfig,
    SDPOConfig,
    SimPOPreference,
)
from composer_replication.config.presets import PO_OBJECTIVES
from composer_replication.config.replica import (
    LocalStoreConfig,
    ReplicaConfig,
    ReplicaDataConfig,
    ReplicaModelConfig,
    ReplicaTorchftConfig,
    S3StoreConfig,
    load_replica_config,
    parse_replica_config,
)
from composer_replication.config.run import RunConfig, demo_config, load_run_config
from composer_replication.config.tasks import TasksConfig
from composer_replication.config.train import (
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    GRPOSection,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    RewardConfig,
    ScheduleConfig,
    TrainConfig,
    VLLMSection,
    build_config,
    grpo_config_problems,
    load_config,
)

__all__ = [
    "PO_OBJECTIVES",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DistributedConfig",
    "GRPOSection",
    "LocalStoreConfig",
    "LoggingConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "OnPolicyConfig",
    "OptimizerConfig",
    "PreferenceConfig",
    "ReplicaConfig",
    "ReplicaDataConfig",
    "ReplicaModelConfig",
    "ReplicaTorchftConfig",
    "RewardConfig",
    "RunConfig",
    "S3StoreConfig",
    "SDPOConfig",
    "ScheduleConfig",
    "StrictModel",
    "TAIDSDPO",
    "TasksConfig",
    "GJSDSDPO",
    "EntropyOPDSDPO",
    "DPOPreference",
    "SimPOPreference",
    "TrainConfig",
    "VLLMSection",
    "build_config",
    "check_base_url",
    "demo_config",
    "format_validation_error",
    "grpo_config_problems",
    "load_config",
    "load_file",
    "load_replica_config",
    "load_run_config",
    "parse_replica_config",
    "read_config_file",
    "set_dotted",
]
