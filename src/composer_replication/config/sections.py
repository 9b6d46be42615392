"""The run config's sections, one per part of the pipeline: the student (``ModelSpec``), where sessions come
from (``sources``), teacher replay (``replay``, its teachers and its defaults), pair mining (``pairs``),
normalisation (``normalize``), the GRPO phase (``grpo``), evaluation (``evaluate``) and the report.
``config.run.RunConfig`` puts them together (and re-exports every name here).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from composer_replication.config.base import StrictModel as _Section
from composer_replication.config.base import check_base_url
from composer_replication.config.train import GRPOSection


class ModelSpec(_Section):
    """Which model. ``name`` is ``default`` (SmolLM2-135M-Instruct, offline), ``tiny`` (a ~200k-parameter
    random Qwen2 with the offline tokenizer, for tests), or a local directory / Hugging Face id."""

    name: str = Field(
        "default",
        description="`default`, `tiny`, a local directory, or a Hugging Face model id (must be cached: nothing downloads).",
    )
    seed: int = Field(0, description="Initialisation seed when `name` is `tiny`.")


class SourcesConfig(_Section):
    """Where the agent sessions come from and how they are read."""

    paths: list[str] = Field(
        default_factory=list,
        description="Session files or directories (searched recursively for `*.jsonl`), e.g. `~/.claude/projects` and `~/.codex/sessions`. Relative paths are relative to the config file.",
    )
    redact: bool = Field(
        True,
        description="Replace secrets (API keys, tokens, private keys, e-mails) before anything is written or sent to a teacher.",
    )
    heldout_traces: list[str] = Field(
        default_factory=list,
        description="Trace ids (session file stems) kept out of replay and training and used for evaluation.",
    )
    heldout_fraction: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="When `heldout_traces` is empty: the fraction of traces held out, chosen by a stable hash of the trace id.",
    )


class TeacherConfig(_Section):
    """One teacher model; the keys are those of ``teacher_replay.TeacherSpec``. ``backend`` picks how it runs."""

    slug: str = Field(
        ...,
        description="Model id: an OpenRouter slug such as `openai/gpt-5`, or a name for an in-process teacher.",
    )
    input_per_mtok: float = Field(
        0.0,
        ge=0.0,
        allow_inf_nan=False,
        description="USD per million prompt tokens (the ledger reserves the worst case with it; the provider's billed cost is recorded when reported).",
    )
    output_per_mtok: float = Field(
        0.0, ge=0.0, allow_inf_nan=False, description="USD per million completion tokens."
    )
    backend: Literal["openai", "transformers"] = Field(
        "openai",
        description="`openai`: any OpenAI-compatible chat-completions server (OpenRouter by default, vLLM, Ollama, llama.cpp). `transformers`: an in-process Hugging Face model (offline).",
    )
    base_url: str | None = Field(
        None,
        description="`openai` only: the server root, e.g. `http://127.0.0.1:8000/v1`; default OpenRouter.",
    )
    api_key_env: str | None = Field(
        None,
        description="`openai` only: the environment variable holding this teacher's key (default `OPENROUTER_API_KEY`; loopback servers need none). Keys are never written to the run directory.",
    )
    model: str | None = Field(
        None, description="`openai` only: the model name sent to the server, when it differs from `slug`."
    )
    model_path: str | None = Field(
        None,
        description="`transformers` only: `default` (SmolLM2-135M-Instruct), `tiny` (a random ~200k-parameter model, seeded by `model_seed`), or a local model directory.",
    )
    model_seed: int = Field(0, description="`transformers` with `model_path: tiny`: initialisation seed.")
    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature; 0 is greedy.")
    extra_body: dict[str, Any] | None = Field(
        None,
        description="`openai` only: extra JSON fields merged into each request, e.g. `{reasoning: {effort: low}}`.",
    )
    tool_mode: Literal["native", "text"] = Field(
        "native",
        description="`native`: asked with the session's `tools`, answers read from `tool_calls`. `text`: the text action format, for endpoints without tool support (a native teacher whose endpoint refuses tools switches by itself).",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None:
            check_base_url(v, "base_url")
        return v

    @model_validator(mode="after")
    def _backend_fields(self) -> TeacherConfig:
        if self.backend == "transformers" and not self.model_path:
            raise ValueError(
                f"teacher {self.slug!r}: backend 'transformers' needs `model_path` (default, tiny, or a model directory)"
            )
        return self


# Replay's defaults, written once: the `replay` section below, `teacher_replay.replay_states` /
# `replay_trace` / `price_run`, `replaysim.replay_and_normalize_trace` and the `replay` CLI take theirs
# from here. The spend cap's 5.0 is the API reference's (`replay_trace(..., max_total_usd=5.0)`); the
# reference fixes no default for the others, so they are the config's (512 tokens, 8 in flight).
MAX_TOTAL_USD = 5.0
REPLAY_MAX_TOKENS = 512
REPLAY_CONCURRENCY = 8
REPLAY_TIMEOUT_S = 120.0


class ReplayConfig(_Section):
    """Teacher replay: every selected state goes to every teacher, under a hard dollar cap."""

    teachers: list[TeacherConfig] = Field(
        default_factory=list,
        description="The teachers. Empty means the three OpenRouter defaults of `teacher_replay.DEFAULT_TEACHERS`.",
    )
    max_total_usd: float = Field(
        MAX_TOTAL_USD,
        ge=0.0,
        allow_inf_nan=False,
        description="Hard cap on the total spend of this run's replay, summed over reruns (the ledger persists).",
    )
    states: Literal["error_sites", "all"] = Field(
        "error_sites",
        description="Which states to replay: only the turns right after a tool error (cheapest, where the recipe learns most) or every assistant turn.",
    )
    max_states: int | None = Field(
        None, ge=1, description="Replay at most this many states (the first ones in file order)."
    )
    max_tokens: int = Field(
        REPLAY_MAX_TOKENS,
        ge=1,
        description="Completion cap per teacher call (also bounds each call's worst-case cost).",
    )
    history_messages: int | None = Field(
        None,
        ge=1,
        description="Send teachers only the system message and the last N messages of each state (long sessions overflow small teachers' context). The mined pairs keep the same shortened history.",
    )
    concurrency: int = Field(REPLAY_CONCURRENCY, ge=1, description="Requests in flight at once.")


class PairsConfig(_Section):
    """Preference-pair mining from teacher agreement."""

    agreement_threshold: int = Field(
        2,
        ge=1,
        description="Minimum number of teachers whose canonical actions agree (and differ from the student's) for a pair to fire.",
    )
    recovery: Literal["none", "failure", "recovery", "both"] = Field(
        "none",
        description="Also mine teacher-free recovery pairs from the training traces (never the held-out ones): at each "
        "tool error followed by an assistant turn, the recovery chosen over the failed action, in the state before the "
        "failed action (`failure`), after its error result (`recovery`) or both (`trainer.data.recovery_pairs`). "
        "They join the teachers' pairs in `pairs/raw_pairs.jsonl`; `none`: teachers' pairs only.",
    )


class NormalizeConfig(_Section):
    """data-juicer normalisation of the mined pairs."""

    skip_dj: bool = Field(
        False, description="Pass pairs through without data-juicer (records carry `metadata.skipped`)."
    )
    recipe: str | None = Field(
        None, description="A data-juicer recipe YAML; default `recipes/replaysim/default.yaml`."
    )


class GRPOPhaseConfig(GRPOSection):
    """The optional online phase after the offline one: GRPO-family RL (TRL) with rollouts on sandbox tasks
    (``tasks``: a task directory or bundled task names; unset, the run's ``tasks`` section's, else every
    bundled task). Every GRPO setting is here: the algorithm's (the trainer's ``grpo`` section: objective,
    group size, completion length, reward, ...) and the phase's (``enabled``, ``max_steps``, ``batch_size``,
    ``lr``).
    The rest of the phase's training settings (optimizer, batch, loss weights) come from ``train``."""

    enabled: bool = Field(False, description="Run the online phase after the offline one.")
    max_steps: int = Field(2, ge=1, description="Optimizer steps of the online phase.")
    lr: float | None = Field(
        None, gt=0.0, description="Learning rate of the online phase; default `train.optimizer.lr`."
    )
    batch_size: int | None = Field(
        None,
        ge=1,
        description="Task prompts per optimizer step of the online phase, each sampled `grpo.num_generations` "
        "times and scored in the sandbox; default `train.schedule.batch_size`.",
    )
    warmup_steps: int | None = Field(
        None,
        ge=0,
        description="Warm-up steps of the online phase; default `train.schedule.warmup_steps`. It must be below "
        "`max_steps` (or 0): a warm-up starts at learning rate 0, so a phase that ends inside it trains at a "
        "fraction of `lr` (a 1-step phase with any warm-up changes no weight).",
    )


class EvalConfig(_Section):
    """Evaluation before and after training."""

    max_sites: int = Field(
        16,
        ge=0,
        description="Held-out error states (the first in file order) whose greedy answers are also generated one "
        "by one, before and after, to read (`eval.json` `before.sites`); 0: none. The before/after numbers "
        "come from every held-out error site (`eval.json` `sites`), whatever this is.",
    )
    max_new_tokens: int = Field(
        256,
        ge=1,
        description="Greedy tokens generated per site (a recorded recovery is ~64 tokens at the median "
        "and often several hundred; a tool call cut short by this budget counts as malformed).",
    )
    max_prompt_tokens: int = Field(
        1024,
        ge=32,
        description="Left-truncate prompts to this many tokens (both the greedy answers and the before/after "
        "site metrics: a window cut to the training `max_seq_len` starves the model of the history it acts on).",
    )
    sandbox_tasks: bool = Field(
        True,
        description="Also measure the pass rate on the bundled sandbox tasks `grpo.tasks` names (all of them when it "
        "names a directory or none), one greedy agent rollout per task; your own tasks: the `tasks` section.",
    )
    sandbox_max_turns: int = Field(3, ge=1, description="Agent turns per sandbox rollout.")
    sandbox_max_new_tokens: int = Field(192, ge=1, description="Tokens per agent turn in sandbox rollouts.")


class ReportConfig(_Section):
    """The HTML report."""

    title: str = Field("composer-replication run", description="Report heading.")
