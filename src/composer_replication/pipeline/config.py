"""The run config's former path: ``RunConfig`` and its loader live in ``composer_replication.config.run``."""

from composer_replication.config.run import (
    EvalConfig,
    GRPOPhaseConfig,
    ModelSpec,
    NormalizeConfig,
    PairsConfig,
    ReplayConfig,
    ReportConfig,
    RunConfig,
    SourcesConfig,
    TeacherConfig,
    TrainSection,
    demo_config,
    load_run_config,
)

__all__ = [
    "EvalConfig",
    "GRPOPhaseConfig",
    "ModelSpec",
    "NormalizeConfig",
    "PairsConfig",
    "ReplayConfig",
    "ReportConfig",
    "RunConfig",
    "SourcesConfig",
    "TeacherConfig",
    "TrainSection",
    "demo_config",
    "load_run_config",
]
