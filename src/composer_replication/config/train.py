"""The typed training config: one pydantic v2 tree, unknown keys rejected, bounds checked.

Importable without torch (the CLI validates a config before any model loads). Load with
``load_config(path, overrides)`` from YAML, TOML or JSON; relative data paths are resolved against the
config file's directory. ``TrainConfig`` is self-contained so a larger run config can embed it.

Pluggable choices are selected by one field each: ``mode`` (offline | grpo), ``model.path``
(``default`` = SmolLM2-135M-Instruct offline, ``tiny`` = a random ~200k-parameter model, or a local
directory), ``loss.sdpo.type``, ``loss.preference.type`` (``config.loss``), ``optimizer.type``, ``schedule.type``,
``grpo.objective`` and ``grpo.reward.type``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from composer_replication.config.base import StrictModel as _Model
from composer_replication.config.base import load_file, validate
from composer_replication.config.loss import LossConfig
from composer_replication.config.presets import PO_OBJECTIVES

DOCS = "docs/training.md"


class ModelConfig(_Model):
    path: str = Field(
        "tiny", description="`default` (SmolLM2-135M-Instruct, offline), `tiny`, or a model directory"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="`auto`: bf16 where the hardware supports it (CUDA bf16), else fp32"
    )
    activation_checkpointing: bool = Field(
        False,
        description="recompute each decoder layer in backward (offline mode): far less activation memory",
    )


class DataConfig(_Model):
    traces: Path | None = Field(
        None, description="traces.jsonl from `ingest` (read through `ingestion.store`) or TraceExample rows"
    )
    pairs: Path | None = Field(None, description="pairs.jsonl (DPOPair or NormalizedDPOPair rows)")
    max_seq_len: int = Field(1024, ge=16, le=131072, description="token cap for student/teacher sequences")
    max_dpo_seq_len: int = Field(
        1024, ge=16, le=131072, description="token cap for chosen/rejected sequences"
    )
    eval_fraction: float = Field(
        0.0, ge=0.0, lt=1.0, description="fraction held out (by hash of the episode id / pair id)"
    )
    whole_responses: bool = Field(
        False,
        description="end each training row at its last assistant response that fits whole in max_seq_len "
        "(no target is an action cut before its end); false: the last response, its first tokens if too long",
    )
    wire_format: Literal["native", "text"] = Field(
        "native",
        description="how traces are shown to the model: native (the chat template's own tool calls, "
        "assistant tool_calls and tool results, tools= schemas) or text (the earlier [TOOL_USE] lines); "
        "training, GRPO, evaluation and export follow it",
    )

    @field_validator("traces", "pairs")
    @classmethod
    def _file_exists(cls, p: Path | None) -> Path | None:
        if p is not None and not Path(p).is_file():
            raise ValueError(
                f"file not found: {p} (run `composer-replication ingest` / `pairs` first, or fix the path)"
            )
        return p


class OptimizerConfig(_Model):
    type: Literal["adamw", "sgd"] = Field("adamw", description="torch optimizer")
    lr: float = Field(1e-5, gt=0.0, le=1.0, description="peak learning rate")
    weight_decay: float = Field(0.0, ge=0.0, description="decoupled weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas")
    grad_clip: float | None = Field(1.0, gt=0.0, description="max grad norm; None disables")


class ScheduleConfig(_Model):
    type: Literal["constant", "linear", "cosine"] = Field("constant", description="LR schedule after warmup")
    warmup_steps: int = Field(0, ge=0, description="linear warmup steps")
    max_steps: int = Field(100, ge=1, description="optimizer steps")
    batch_size: int = Field(2, ge=1, description="examples per micro-batch")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")


class CheckpointConfig(_Model):
    every_steps: int = Field(50, ge=0, description="save every N optimizer steps (0: only at the end)")
    keep_last: int = Field(2, ge=1, description="checkpoints kept")


class LoraConfig(_Model):
    enabled: bool = Field(False, description="train a PEFT LoRA adapter instead of all weights")
    r: int = Field(8, ge=1, description="rank")
    alpha: int = Field(16, ge=1, description="scaling alpha")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="adapter dropout")
    target_modules: list[str] | str = Field("all-linear", description="modules to adapt")


class RewardConfig(_Model):
    type: Literal["teacher_match", "tool_format"] = Field(
        "teacher_match",
        description="teacher_match: similarity of the completion to the teacher-consensus action of the "
        "state's pair; tool_format: 1 if the completion holds a well-formed tool call (the wire action format)",
    )


class VLLMSection(_Model):
    mode: Literal["server", "colocate"] = Field(
        ...,
        description="server: a `trl vllm-serve` process generates; colocate: vLLM inside each training process",
    )
    server_url: str | None = Field(
        None, description="server mode: the vLLM server, e.g. http://10.0.0.5:8000"
    )
    server_timeout_s: float = Field(240.0, gt=0, description="server mode: how long to wait for it to answer")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="colocate: GPU memory share for vLLM")
    tensor_parallel_size: int = Field(1, ge=1, description="colocate: GPUs per vLLM engine")
    max_model_length: int | None = Field(None, ge=16, description="vLLM context; None: from the model")
    enable_sleep_mode: bool = Field(
        False, description="colocate: offload vLLM weights/cache during the update"
    )

    @model_validator(mode="after")
    def _url_for_server(self) -> VLLMSection:
        if self.mode == "server":
            from urllib.parse import urlsplit

            url = urlsplit(self.server_url or "")
            if url.scheme not in ("http", "https") or not url.netloc:
                raise ValueError(
                    f"server_url {self.server_url!r}: mode server needs the vLLM server's http(s)://host:port"
                )
        elif self.server_url is not None:
            raise ValueError("server_url is for mode: server (colocate runs vLLM in each training process)")
        return self


class GRPOSection(_Model):
    objective: str = Field("dr_grpo", description="policy-optimisation preset: one of PO_OBJECTIVES")
    num_generations: int = Field(4, ge=2, description="group size G")
    max_completion_length: int = Field(64, ge=1, description="completion token cap (Dr.GRPO normaliser)")
    temperature: float = Field(1.0, gt=0.0, description="sampling temperature")
    composer_kl_coef: float = Field(0.0, ge=0.0, description="k1 KL in the reward (Composer report); 0 off")
    reward: RewardConfig = Field(default_factory=RewardConfig)
    overrides: dict[str, Any] = Field(default_factory=dict, description="extra trl.GRPOConfig fields")
    vllm: VLLMSection | None = Field(
        None, description="generate with vLLM (TRL's use_vllm); None: HF generate"
    )
    tasks: str | list[str] | None = Field(
        None,
        description="sandbox coding tasks to train on, scored by the shaped sandbox reward (the share of the "
        "task's checks passing plus the format and runs terms): a task directory (`tasks mine --out`, or "
        "folders in the `task.json` layout; relative to the config file) or a list of bundled task names. "
        "None: train mode takes its prompts from the data files; `run` uses its `tasks` section's, else every "
        "bundled task",
    )

    @field_validator("tasks")
    @classmethod
    def _task_dir_exists(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, str) and not Path(v).is_dir():
            raise ValueError(
                f"{v}: no such task directory (mine one with `composer-replication tasks mine --out {v}`, or "
                "list bundled task names)"
            )
        return v

    @model_validator(mode="after")
    def _vllm_in_one_place(self) -> GRPOSection:
        clash = sorted(k for k in self.overrides if k == "use_vllm" or k.startswith("vllm_"))
        if self.vllm is not None and clash:
            raise ValueError(f"overrides {clash} clash with grpo.vllm: set vLLM in grpo.vllm only")
        return self

    @field_validator("objective")
    @classmethod
    def _objective_known(cls, objective: str) -> str:
        if objective not in PO_OBJECTIVES:
            raise ValueError(
                f"{objective!r} is not in the menu; choose one of {', '.join(sorted(PO_OBJECTIVES))}"
            )
        return objective


class DistributedConfig(_Model):
    strategy: Literal["ddp", "fsdp2"] = Field(
        "ddp",
        description="with several processes: ddp (replicas) or fsdp2 (sharded; models that do not fit one device)",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="auto: nccl on CUDA, else gloo")
    timeout_s: float = Field(1800.0, gt=0, description="collective timeout (seconds)")
    rendezvous_timeout_s: float = Field(120.0, gt=0, description="wait for the other processes (seconds)")


class LoggingConfig(_Model):
    report_to: list[Literal["tensorboard", "wandb", "trackio", "none"]] = Field(
        default_factory=list,
        description="trackers besides metrics.jsonl (TRL's names); grpo passes them to TRL",
    )
    log_every: int = Field(1, ge=1, description="metrics.jsonl row every N optimizer steps")
    plot: bool = Field(True, description="write losses.png (matplotlib) at the end")
    progress: bool = Field(True, description="tqdm progress bar")


class TrainConfig(_Model):
    mode: Literal["offline", "grpo"] = Field(
        "offline", description="offline: SFT+SDPO+DPO on ingested data; grpo: TRL"
    )
    seed: int = Field(0, ge=0, description="seeds torch, numpy, random and the data order")
    deterministic: bool = Field(
        True, description="torch deterministic algorithms (bit-identical resume on CPU)"
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _needs_data(self, info: ValidationInfo) -> TrainConfig:
        # A caller that brings its own batches (``trainer.offline.batch_stepper``) validates with
        # context={"batches": True}: its config names no data files.
        if self.data.traces is None and self.data.pairs is None and not (info.context or {}).get("batches"):
            if not (self.mode == "grpo" and self.grpo.tasks is not None):
                raise ValueError(
                    "data: set data.traces and/or data.pairs (paths to traces.jsonl / pairs.jsonl), or in grpo "
                    "mode grpo.tasks"
                )
        return self


# trl.GRPOConfig fields that a TrainConfig field decides: in grpo.overrides they are a conflict.
GRPO_OWNED_ARGS = {
    "output_dir": "the run directory (--out)", "learning_rate": "optimizer.lr",
    "weight_decay": "optimizer.weight_decay", "adam_beta1": "optimizer.betas", "adam_beta2": "optimizer.betas",
    "optim": "optimizer.type", "max_grad_norm": "optimizer.grad_clip", "lr_scheduler_type": "schedule.type",
    "warmup_steps": "schedule.warmup_steps", "max_steps": "schedule.max_steps",
    "per_device_train_batch_size": "schedule.batch_size", "gradient_accumulation_steps": "schedule.grad_accum",
    "num_generations": "grpo.num_generations", "max_completion_length": "grpo.max_completion_length",
    "temperature": "grpo.temperature", "seed": "seed", "bf16": "model.dtype", "report_to": "logging.report_to",
    "logging_steps": "logging.log_every", "disable_tqdm": "logging.progress",
    "save_strategy": "checkpoint.every_steps", "save_steps": "checkpoint.every_steps",
    "save_total_limit": "checkpoint.keep_last",
}  # fmt: skip


def grpo_config_problems(
    cfg: Any, *, pipeline: bool = False, known_args: set[str] | None = None, grpo: Any = None
) -> list[str]:
    """The fields of ``cfg`` (a ``TrainConfig`` or the run config's ``train`` section) that grpo mode
    cannot honour, one line each (docs/training.md, "GRPO mode"). ``pipeline``: the online phase of
    ``run``, where ``loss.label_smoothing`` and ``data.eval_fraction`` belong to the offline phase.
    ``known_args``: ``trl.GRPOConfig``'s field names, to check ``grpo.overrides`` keys against.
    ``grpo``: the GRPO section when it is not ``cfg.grpo`` (the run config's own ``grpo``)."""
    problems = []
    if not pipeline and cfg.loss.label_smoothing > 0:
        problems.append("loss.label_smoothing: grpo mode has no cross-entropy channel to smooth; set it to 0")
    if not pipeline and cfg.data.eval_fraction > 0:
        problems.append("data.eval_fraction: grpo mode holds nothing out; set it to 0 (evaluate with `run`)")
    sdpo = cfg.loss.sdpo
    if not pipeline and "source" in sdpo.model_fields_set and sdpo.source == "recorded":
        problems.append(
            "loss.sdpo.source: grpo mode's SDPO scores the sampled completions; remove it or use on_policy"
        )
    if not pipeline and "on_policy" in sdpo.model_fields_set:
        problems.append(
            "loss.sdpo.on_policy: grpo mode samples with grpo.max_completion_length/temperature; remove it"
        )
    if not pipeline and cfg.grpo.tasks is not None and "reward" in cfg.grpo.model_fields_set:
        problems.append("grpo.reward: with grpo.tasks the reward is the shaped sandbox reward; remove it")
    for key in (grpo if grpo is not None else cfg.grpo).overrides:
        if key in GRPO_OWNED_ARGS:
            problems.append(f"grpo.overrides.{key}: set {GRPO_OWNED_ARGS[key]} instead")
        elif known_args is not None and key not in known_args:
            problems.append(f"grpo.overrides.{key}: not a trl.GRPOConfig field")
    return problems


def _resolve_data_paths(data: dict[str, Any], base_dir: Path) -> None:
    section = data.get("data")
    if isinstance(section, dict):
        for key in ("traces", "pairs"):
            value = section.get(key)
            if value and not Path(value).is_absolute():
                section[key] = str(base_dir / value)
    resolve_task_dir(data, base_dir)


def resolve_task_dir(data: dict[str, Any], base_dir: Path) -> None:
    """``grpo.tasks`` given as a relative directory, resolved against the config file's directory."""
    grpo = data.get("grpo")
    if isinstance(grpo, dict) and isinstance(grpo.get("tasks"), str):
        grpo["tasks"] = str(base_dir / Path(grpo["tasks"]).expanduser())


def build_config(
    data: Mapping[str, Any], *, source: str = "<config>", base_dir: Path | None = None
) -> TrainConfig:
    """Validate a mapping into ``TrainConfig`` (``ConfigError`` names each bad field)."""
    copy: dict[str, Any] = json.loads(json.dumps(data, default=str))  # a private copy; Paths become strings
    if base_dir is not None:
        _resolve_data_paths(copy, base_dir)
    return validate(TrainConfig, copy, source=source, docs=DOCS)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Load YAML/TOML/JSON from ``path``; ``overrides`` maps dotted keys (``schedule.max_steps``) to values.

    Relative ``data.traces``/``data.pairs`` resolve against the file's directory. Raises
    ``FileNotFoundError`` or ``ConfigError`` naming the file and each bad field.
    """
    return load_file(path, TrainConfig, overrides, docs=DOCS, prepare=_resolve_data_paths)
