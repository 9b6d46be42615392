"""The run configuration: one typed tree for the whole pipeline, loaded from YAML, TOML or JSON.

Every section rejects unknown keys (a typo is an error that names the key, not a silently ignored
setting). Each stage's cache key is the hash of the section(s) it reads, so editing the ``report``
section never re-runs training, and editing ``replay.teachers`` re-runs replay (through its cache:
calls already paid for are not paid again) and everything downstream.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, create_model, field_validator, model_validator

from composer_replication.config.base import StrictModel as _Section
from composer_replication.config.base import load_file
from composer_replication.config.sections import (  # re-exported: users and the replay modules read them here
    MAX_TOTAL_USD,
    REPLAY_CONCURRENCY,
    REPLAY_MAX_TOKENS,
    REPLAY_TIMEOUT_S,
    EvalConfig,
    GRPOPhaseConfig,
    ModelSpec,
    NormalizeConfig,
    PairsConfig,
    ReplayConfig,
    ReportConfig,
    SourcesConfig,
    TeacherConfig,
)
from composer_replication.config.tasks import TasksConfig, resolve_task_paths
from composer_replication.config.train import GRPOSection, TrainConfig, build_config, resolve_task_dir

DOCS = "docs/configuration.md"

__all__ = [
    "DOCS",
    "EvalConfig",
    "GRPOPhaseConfig",
    "MAX_TOTAL_USD",
    "ModelSpec",
    "NormalizeConfig",
    "PairsConfig",
    "REPLAY_CONCURRENCY",
    "REPLAY_MAX_TOKENS",
    "REPLAY_TIMEOUT_S",
    "ReplayConfig",
    "ReportConfig",
    "RunConfig",
    "SourcesConfig",
    "TeacherConfig",
    "TrainSection",
    "demo_config",
    "load_run_config",
]


def _train_section() -> type[BaseModel]:
    """The trainer's ``TrainConfig`` fields, minus what the pipeline decides or keeps elsewhere.

    ``mode`` (the pipeline runs the offline phase, then the GRPO phase), ``model`` (the ``student``
    section), ``grpo`` (the run's own ``grpo`` section) and the data paths (``data.traces``/``data.pairs``,
    the pipeline's own files) are filled in per phase by ``RunConfig.train_config``; every other field,
    default and bound is the trainer's own.
    """
    fields: dict[str, Any] = {
        n: (f.annotation, f)
        for n, f in TrainConfig.model_fields.items()
        if n not in ("mode", "model", "grpo")
    }
    return create_model("TrainSection", __base__=_Section, __doc__=TrainConfig.__doc__, **fields)


if TYPE_CHECKING:  # the same fields, for the type checker (less mode, model and grpo at run time)
    TrainSection = TrainConfig
else:
    TrainSection = _train_section()


class RunConfig(_Section):
    """A whole pipeline run: sessions -> replay -> pairs -> normalize -> train -> evaluate -> report
    (with ``tasks``: mine -> eval before -> train -> eval after on tasks from your sessions)."""

    run_dir: str | None = Field(
        None,
        description="Run directory; `composer-replication run --out` overrides it. Relative to the config file.",
    )
    seed: int = Field(0, description="Global seed (data split, sampling, initialisation).")
    student: ModelSpec = Field(default_factory=ModelSpec, description="The model being trained.")
    sources: SourcesConfig = Field(default_factory=SourcesConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    pairs: PairsConfig = Field(default_factory=PairsConfig)
    normalize: NormalizeConfig = Field(default_factory=NormalizeConfig)
    train: TrainSection = Field(
        default_factory=TrainSection,
        description="Training (the trainer's `TrainConfig` without `mode` and `model`; `data.traces`/`data.pairs` are set by the pipeline). Used by both phases.",
    )
    grpo: GRPOPhaseConfig = Field(default_factory=GRPOPhaseConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    evaluate: EvalConfig = Field(default_factory=EvalConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)

    @model_validator(mode="before")
    @classmethod
    def _grpo_in_one_place(cls, data: Any) -> Any:
        """Files written before ``grpo`` held every GRPO setting put the algorithm's in ``train.grpo``:
        those still load, moved to ``grpo``; a key set in both places is an error naming ``grpo.KEY``."""
        train = data.get("train") if isinstance(data, dict) else None
        if not isinstance(train, dict) or "grpo" not in train:
            return data
        train = dict(train)
        old, new = train.pop("grpo"), data.get("grpo") or {}
        if not isinstance(old, dict) or not isinstance(new, dict):
            return data  # the type error is reported on the field
        both = sorted(k for k in set(old) & set(new) if old[k] != new[k])
        if both:
            raise ValueError(
                "the GRPO settings are one section now, `grpo`: move train.grpo."
                + ", train.grpo.".join(both)
                + " there (it also sets "
                + ", ".join(f"grpo.{k}" for k in both)
                + ")"
            )
        return {**data, "train": train, "grpo": {**old, **new}}

    @field_validator("train")
    @classmethod
    def _no_data_paths(cls, v: Any) -> Any:
        if v.data.traces is not None or v.data.pairs is not None:
            raise ValueError(
                "train.data.traces / train.data.pairs are set by the pipeline from its own stages; remove them"
            )
        return v

    @model_validator(mode="after")
    def _grpo_phase_honours_train(self) -> RunConfig:
        if self.grpo.enabled:
            from composer_replication.config.train import grpo_config_problems

            problems = [
                p if p.startswith("grpo.") else f"train.{p}"
                for p in grpo_config_problems(self.train, pipeline=True, grpo=self.grpo)
            ]
            warmup = (
                self.train.schedule.warmup_steps if self.grpo.warmup_steps is None else self.grpo.warmup_steps
            )
            if warmup and warmup >= self.grpo.max_steps:
                where = (
                    "grpo.warmup_steps"
                    if self.grpo.warmup_steps is not None
                    else "train.schedule.warmup_steps"
                )
                problems.append(
                    f"{where}={warmup} with grpo.max_steps={self.grpo.max_steps}: the phase would end inside its "
                    "warm-up, which starts at learning rate 0; set grpo.warmup_steps below grpo.max_steps (e.g. 0)"
                )
            if self.grpo.reward.type != "teacher_match":  # the default; the phase has its own reward
                problems.append(
                    "grpo.reward: the GRPO phase scores with the sandbox's shaped reward; remove it"
                )
            if problems:
                raise ValueError("the GRPO phase cannot honour " + "; ".join(problems))
        return self

    @field_validator("sources")
    @classmethod
    def _expand(cls, v: SourcesConfig) -> SourcesConfig:
        v.paths = [os.path.expanduser(p) for p in v.paths]
        return v

    def train_config(self, mode: str, *, model: str, traces: str | None, pairs: str | None) -> TrainConfig:
        """The trainer's ``TrainConfig`` for one phase: ``train`` + the algorithm fields of ``grpo`` + the
        pipeline's model and data files; the GRPO phase trains ``grpo.max_steps`` steps of ``grpo.batch_size`` prompts at ``grpo.lr`` after
        ``grpo.warmup_steps`` (each unset: the ``train`` value)."""
        data = self.train.model_dump(mode="json")
        data["data"].update(traces=traces, pairs=pairs)
        data["grpo"] = self.grpo.model_dump(mode="json", include=set(GRPOSection.model_fields))
        data["mode"], data["model"] = mode, {"path": model}
        if mode == "grpo":
            data["schedule"]["max_steps"] = self.grpo.max_steps
            if self.grpo.warmup_steps is not None:
                data["schedule"]["warmup_steps"] = self.grpo.warmup_steps
            if self.grpo.lr is not None:
                data["optimizer"]["lr"] = self.grpo.lr
            if self.grpo.batch_size is not None:
                data["schedule"]["batch_size"] = self.grpo.batch_size
        return build_config(data, source=f"run config (train, {mode} phase)")

    def section_hash(self, *names: str) -> str:
        """Stable hash of the named sections (the cache key of a stage)."""
        data = {n: _dump(getattr(self, n)) for n in names}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _dump(v: Any) -> Any:
    return v.model_dump(mode="json") if isinstance(v, BaseModel) else v


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    src = raw.get("sources")
    if isinstance(src, dict) and isinstance(src.get("paths"), list):
        src["paths"] = [_resolve(base, p) for p in src["paths"]]
    if isinstance(raw.get("run_dir"), str):
        raw["run_dir"] = _resolve(base, raw["run_dir"])
    resolve_task_dir(raw, base)
    resolve_task_paths(raw, base)


def load_run_config(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML/TOML/JSON run config; relative paths in it resolve against the file's directory.

    Raises ``ConfigError`` (a ``ValueError``) naming the file and the offending field, or
    ``FileNotFoundError``.
    """
    return load_file(Path(path), RunConfig, overrides, docs=DOCS, prepare=_resolve_paths)


def _resolve(base: Path, p: str) -> str:
    q = Path(os.path.expanduser(str(p)))
    return str(q if q.is_absolute() else (base / q).resolve())


def demo_config(*, fast: bool = False) -> RunConfig:
    """The bundled demo: example sessions, SmolLM2 student (``fast``: tiny models), in-process teachers."""
    from importlib import resources

    data = resources.files("composer_replication") / "data"
    cfg = load_run_config(Path(str(data / "demo.yaml")))
    if fast:
        fast_over = json.loads((data / "demo_fast.json").read_text())
        merged = cfg.model_dump(mode="json")
        _deep_update(merged, fast_over)
        cfg = RunConfig.model_validate(merged)
    return cfg


def _deep_update(d: dict[str, Any], u: dict[str, Any]) -> None:
    for k, v in u.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            _deep_update(d[k], v)
        else:
            d[k] = v
