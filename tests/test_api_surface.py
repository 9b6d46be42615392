"""The public API pinned to ``/work/shared/spec/api_reference.md`` (§1–§12; §13–§17 by module).

Every expected signature below is the reference's own text, pasted as a stub and compiled with
postponed annotations (so annotations are never evaluated) in the namespace of the module under test
(so a default such as ``SYSTEM_PROMPT`` or ``tuple(DEFAULT_TEACHERS)`` means that module's value).
Read the tables side by side with the reference.

Rule (reference: "improve behind it, never break it"): parameter names, kinds, order and defaults must
match exactly; the only extras allowed are trailing keyword-only parameters that have defaults.
Dataclass / TypedDict fields: the reference's fields in order with their defaults; extra dataclass
fields must come last and have defaults; extra TypedDict keys must be optional.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import importlib.util
import inspect
import textwrap
import typing
from dataclasses import MISSING
from pathlib import Path

import pytest

P = inspect.Parameter
# Postponed annotations for the stubs: the reference's type hints are text, never evaluated.
_FUTURE = importlib.import_module("__future__").annotations.compiler_flag

# ---------------------------------------------------------------------------------------------------
# Helpers: compile a stub from the reference, compare.
# ---------------------------------------------------------------------------------------------------


def _stub_namespace(module) -> dict:
    ns = dict(vars(module))
    ns.update(
        {
            "dataclass": dataclasses.dataclass,
            "field": dataclasses.field,
            "TypedDict": typing.TypedDict,
            "ClassVar": typing.ClassVar,
            "Protocol": typing.Protocol,
        }
    )
    return ns


def _compile_stub(module, source: str):
    """Exec ``source`` (one ``def`` or ``class``) in ``module``'s namespace; return the object."""
    source = textwrap.dedent(source).strip()
    if source.startswith(("def ", "async def ")) and not source.rstrip().endswith(":"):
        source += ": ..."
    ns = _stub_namespace(module)
    code = compile(source, "<api_reference stub>", "exec", flags=_FUTURE, dont_inherit=True)
    exec(code, ns)
    return ns[ast.parse(source).body[0].name]


def _resolve(module_name: str, qualname: str):
    module = importlib.import_module(module_name)
    obj = module
    for part in qualname.split("."):
        assert hasattr(obj, part), f"{module_name}.{qualname}: {part!r} is missing"
        obj = getattr(obj, part)
    return module, obj


def _fmt(p: inspect.Parameter) -> str:
    return str(p.replace(annotation=P.empty))


def _sig_str(params) -> str:
    return "(" + ", ".join(_fmt(p) for p in params) + ")"


def _defaults_equal(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, bool) or isinstance(b, bool):  # True == 1, but not the same default
        return type(a) is type(b) and a == b
    try:
        return bool(a == b)
    except Exception:  # e.g. an ambiguous tensor comparison
        return False


def signature_problems(actual: inspect.Signature, expected: inspect.Signature) -> list[str]:
    exp = list(expected.parameters.values())
    act = list(actual.parameters.values())
    problems: list[str] = []
    exp_kw = exp.pop() if exp and exp[-1].kind is P.VAR_KEYWORD else None
    act_kw = act.pop() if act and act[-1].kind is P.VAR_KEYWORD else None
    if exp_kw is not None and act_kw is None:
        problems.append(f"missing **{exp_kw.name}")
    if act_kw is not None and exp_kw is None:
        problems.append(f"extra **{act_kw.name} (not in the reference)")
    for i, e in enumerate(exp):
        if i >= len(act):
            problems.append(f"missing parameter {_fmt(e)!r}")
            continue
        a = act[i]
        if e.kind is P.VAR_POSITIONAL and a.kind is P.VAR_POSITIONAL:
            continue
        if a.name != e.name or a.kind is not e.kind:
            problems.append(
                f"parameter {i}: expected {_fmt(e)!r} ({e.kind.description}), "
                f"got {_fmt(a)!r} ({a.kind.description})"
            )
        elif not _defaults_equal(a.default, e.default):
            problems.append(f"parameter {e.name!r}: default expected {e.default!r}, got {a.default!r}")
    for a in act[len(exp) :]:
        if a.kind is not P.KEYWORD_ONLY or a.default is P.empty:
            problems.append(
                f"extra parameter {_fmt(a)!r} ({a.kind.description}): only trailing keyword-only "
                "parameters with defaults may be added"
            )
    if problems:
        problems.append(f"expected {_sig_str(expected.parameters.values())}")
        problems.append(f"actual   {_sig_str(actual.parameters.values())}")
    return problems


# ---------------------------------------------------------------------------------------------------
# §1–§12: callables. (module, qualname, reference text, kind) — kind: "def" | "async" | "static"
# ---------------------------------------------------------------------------------------------------

SIGNATURES: list[tuple[str, str, str, str]] = [
    # §2 loss
    (
        "composer_replication.loss",
        "compose_loss",
        """
        def compose_loss(
         model: torch.nn.Module,
         inputs: dict[str, torch.Tensor],
         *,
         alpha_sdpo: float = 0.1,
         beta_replay: float = 0.05,
         sdpo_jsd_beta: float = 0.5,
         sdpo_temperature: float = 1.0,
         sdpo_token_clip: float | None = None,
         replay_dpo_beta: float = 0.1,
         lm_ce_label_smoothing: float = 0.0,
         dpo_variant: Literal["dpo", "simpo"] = "dpo",
         sdpo_wrapper: Literal["none", "taid", "entropy_opd"] = "none",
         taid_t: float | None = None,
         simpo_beta: float = 2.0,
         simpo_gamma: float = 1.0,
         entropy_opd_h_max: float | None = None,
        ) -> LossComponents
        """,
        "def",
    ),
    ("composer_replication.loss", "LossComponents.detached", "def detached(self) -> dict[str, float]", "def"),
    # §3 batch
    (
        "composer_replication.batch",
        "build_batch",
        """
        def build_batch(
         tokenizer: Any,
         *,
         device: torch.device | str = "cpu",
         seed: int = 42,
         variant: str = "factorial",
         align_sdpo_shapes: bool = False,
        ) -> dict[str, torch.Tensor]
        """,
        "def",
    ),
    # §4 opsd
    (
        "composer_replication.opsd",
        "generalized_jsd_loss",
        """
        def generalized_jsd_loss(
         student_logits: torch.Tensor,
         teacher_logits: torch.Tensor,
         labels: torch.Tensor | None = None,
         beta: float = 0.5,
         temperature: float = 1.0,
         reduction: str = "batchmean",
         logits_are_probs: bool = False,
         top_k: int | None = None,
         token_clip: float | None = None,
        ) -> torch.Tensor
        """,
        "def",
    ),
]

# §5 distillation: the same function from the package and from its source module.
_SIMPO = """
def simpo_loss(
 chosen_avg_logprobs: torch.Tensor,
 rejected_avg_logprobs: torch.Tensor,
 *,
 beta: float = 2.0,
 gamma: float = 1.0,
) -> torch.Tensor
"""
_TAID = """
def taid_loss(
 student_logits: torch.Tensor,
 teacher_logits: torch.Tensor,
 mask: torch.Tensor | None = None,
 *,
 t: float | torch.Tensor,
) -> torch.Tensor
"""
_EOPD = """
def entropy_aware_opd_loss(
 student_logits: torch.Tensor,
 teacher_logits: torch.Tensor,
 *,
 labels: torch.Tensor | None = None,
 h_max: float | None = None,
 temperature: float = 1.0,
 reduction: str = "batchmean",
) -> torch.Tensor
"""
_TAID_SCHED = """
def __init__(self, num_train_steps, *, t_start=0.4, t_end=1.0, alpha=5e-4, beta=0.99,
             disable_adaptive=False, device="cpu")
"""
SIGNATURES += [
    ("composer_replication.distillation", "simpo_loss", _SIMPO, "def"),
    ("composer_replication.distillation.simpo", "simpo_loss", _SIMPO, "def"),
    (
        "composer_replication.distillation.simpo",
        "avg_sequence_logprob",
        """
        def avg_sequence_logprob(
         model_logprobs: torch.Tensor,
         response_mask: torch.Tensor,
        ) -> torch.Tensor
        """,
        "def",
    ),
    ("composer_replication.distillation", "taid_loss", _TAID, "def"),
    ("composer_replication.distillation.taid", "taid_loss", _TAID, "def"),
    ("composer_replication.distillation", "TAIDScheduler.__init__", _TAID_SCHED, "def"),
    (
        "composer_replication.distillation",
        "TAIDScheduler.update_t",
        "def update_t(self, loss, global_step)",
        "def",
    ),
    ("composer_replication.distillation", "entropy_aware_opd_loss", _EOPD, "def"),
    ("composer_replication.distillation.entropy_aware_opd", "entropy_aware_opd_loss", _EOPD, "def"),
    (
        "composer_replication.distillation.entropy_aware_opd",
        "teacher_entropy",
        "def teacher_entropy(teacher_logits)",
        "def",
    ),
]

# §6 teacher_replay
SIGNATURES += [
    (
        "composer_replication.teacher_replay",
        "replay_trace",
        """
        async def replay_trace(
         states: Sequence[TraceState],
         teachers: Sequence[TeacherSpec] = tuple(DEFAULT_TEACHERS),
         max_total_usd: float = 5.0,
         api_key: str | None = None,
        ) -> list[TeacherCallResult]
        """,
        "async",
    ),
    (
        "composer_replication.teacher_replay",
        "extract_dpo_pairs",
        """
        def extract_dpo_pairs(
         states: Sequence[TraceState],
         teacher_actions: Sequence[TeacherCallResult],
         agreement_threshold: int = 2,
        ) -> list[DPOPair]
        """,
        "def",
    ),
    (
        "composer_replication.teacher_replay",
        "save_pairs",
        "def save_pairs(pairs: Sequence[DPOPair], path: str | Path) -> None",
        "def",
    ),
]

# §7 replaysim
SIGNATURES += [
    (
        "composer_replication.replaysim",
        "DJNormalizer.__init__",
        """
        def __init__(
         self,
         recipe_path: str | os.PathLike[str] | None = None,
         *,
         skip_dj: bool = False,
        ) -> None
        """,
        "def",
    ),
    (
        "composer_replication.replaysim",
        "DJNormalizer.normalize",
        """
        def normalize(
         self,
         pairs: Iterable[DPOPair | dict[str, Any]],
        ) -> list[NormalizedDPOPair]
        """,
        "def",
    ),
    (
        "composer_replication.replaysim",
        "replay_and_normalize_trace",
        """
        async def replay_and_normalize_trace(
         *,
         states: Any,
         teachers: Any = None,
         agreement_threshold: int = 2,
         max_total_usd: float = 5.0,
         normalizer: DJNormalizer | None = None,
         **replay_kwargs: Any,
        ) -> tuple[list[TeacherCallResult], list[NormalizedDPOPair]]
        """,
        "async",
    ),
    (
        "composer_replication.replaysim.normalize",
        "replay_and_normalize_trace_sync",
        "def replay_and_normalize_trace_sync(*args, **kwargs)",
        "def",
    ),
]

# §8 ingestion
SIGNATURES += [
    (
        "composer_replication.ingestion.claude_code",
        "ClaudeCodeIngester.__init__",
        """
        def __init__(
         self,
         *,
         system_prompt: str = SYSTEM_PROMPT,
         skip_sidechain: bool = True,
         strip_thinking: bool = True,
         max_history_tokens: int | None = None,
        ) -> None
        """,
        "def",
    ),
    (
        "composer_replication.ingestion.claude_code",
        "ClaudeCodeIngester.ingest",
        "def ingest(self, path: Path) -> Iterator[TraceState]",
        "def",
    ),
]

# §9 hint_generator
SIGNATURES += [
    (
        "composer_replication.hint_generator",
        "dispatch",
        "def dispatch(error_kind: str, ctx: HintContext | None = None) -> str | None",
        "def",
    ),
    (
        "composer_replication.hint_generator",
        "register",
        "def register(error_kind: str, fn: Callable[[HintContext], str]) -> None",
        "def",
    ),
] + [
    ("composer_replication.hint_generator", f"hint_{k}", f"def hint_{k}(ctx) -> str", "def")
    for k in ("tool_not_found", "json_decode", "type_error", "runtime_error", "repeated_failure")
]

# §10 trainer
_CRT = "composer_replication.trainer.composer_trainer"
SIGNATURES += [
    (
        _CRT,
        "ComposerReplicationTrainer.__init__",
        """
        def __init__(
         self,
         *args: Any,
         alpha_sdpo: float = 0.1,
         beta_replay: float = 0.05,
         sdpo_jsd_beta: float = 0.5,
         sdpo_temperature: float = 1.0,
         sdpo_token_clip: float | None = None,
         replay_dpo_beta: float = 0.1,
         **kwargs: Any,
        ) -> None
        """,
        "def",
    ),
    (
        _CRT,
        "ComposerReplicationTrainer._compute_loss",
        """
        def _compute_loss(
         self,
         model: torch.nn.Module,
         inputs: dict[str, torch.Tensor],
        ) -> torch.Tensor
        """,
        "def",
    ),
    (
        _CRT,
        "ComposerReplicationTrainer._compute_sdpo_loss",
        "def _compute_sdpo_loss(self, model, inputs)",
        "def",
    ),
    (
        _CRT,
        "ComposerReplicationTrainer._compute_trace_replay_loss",
        "def _compute_trace_replay_loss(self, model, inputs)",
        "def",
    ),
    (
        _CRT,
        "ComposerReplicationTrainer._sequence_logprobs",
        "def _sequence_logprobs(model, input_ids, response_mask)",
        "static",
    ),
    ("composer_replication.trainer", "make_dr_grpo_config", "def make_dr_grpo_config(**overrides)", "def"),
    (
        "composer_replication.trainer",
        "make_po_config",
        'def make_po_config(objective="dr_grpo", **overrides)',
        "def",
    ),
    (
        "composer_replication.trainer.data_collator",
        "TokenizerLike.__call__",
        "def __call__(self, text: str | list[str], **kwargs: Any) -> dict[str, list]",
        "def",
    ),
    (
        "composer_replication.trainer.data_collator",
        "TokenizerLike.apply_chat_template",
        "def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> str | list[int]",
        "def",
    ),
    (
        "composer_replication.trainer.data_collator",
        "ComposerDataCollator.__call__",
        "def __call__(self, batch: Sequence[TraceExample]) -> dict[str, torch.Tensor]",
        "def",
    ),
]

# §11 diloco
SIGNATURES += [
    (
        "composer_replication.diloco",
        "make_diloco_outer_loop",
        """
        def make_diloco_outer_loop(
         manager: Any,
         model_fragments: list[torch.nn.Module],
         inner_optimizer: torch.optim.Optimizer,
         *,
         outer_lr: float = 0.7,
         outer_momentum: float = 0.9,
         nesterov: bool = True,
         sync_every: int = 100,
         fragment_sync_delay: int = 0,
         fragment_update_alpha: float = 0.0,
        ) -> Any
        """,
        "def",
    ),
]

# §12 diloco.serverless (the reference is cut off inside ``collect``: its known prefix is pinned)
_EXE = "composer_replication.diloco.serverless.executor"
SIGNATURES += [
    (
        _EXE,
        "ServerlessExecutor.launch_replicas",
        """
        def launch_replicas(
         self,
         n_replicas: int,
         entrypoint: str | Callable[..., Any],
         entrypoint_args: Mapping[str, Any],
         *,
         gpu: str | None = None,
         timeout: int = 3600,
        ) -> list[ReplicaHandle]
        """,
        "def",
    ),
    (_EXE, "ServerlessExecutor.poll", "def poll(self, handle: ReplicaHandle) -> str", "def"),
    (
        _EXE,
        "ServerlessExecutor.stream_logs",
        "def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str",
        "def",
    ),
    (_EXE, "ServerlessExecutor.cancel", "def cancel(self, handle: ReplicaHandle) -> None", "def"),
    (
        _EXE,
        "ServerlessExecutor.collect",
        "def collect(self, handles: list[ReplicaHandle], *, timeout: int | None = None)",
        "def",
    ),
]


# Every executor backend (§12 .modal, .hf_jobs; §15 .eks, .sagemaker; the local one) implements the
# protocol's methods with the protocol's signatures.
_PROTOCOL_METHODS = [row for row in SIGNATURES if row[1].startswith("ServerlessExecutor.")]
_BACKEND_MODULES = ["local_process", "modal", "hf_jobs", "eks", "sagemaker"]


def _executor_classes(module_name: str) -> list[type]:
    module = importlib.import_module(f"composer_replication.diloco.serverless.{module_name}")
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and obj.__module__ == module.__name__
        and callable(getattr(obj, "launch_replicas", None))
    ]
    assert found, f"{module.__name__} defines no executor class (one with launch_replicas)"
    return found


@pytest.mark.parametrize("backend", _BACKEND_MODULES)
def test_executor_backends_follow_the_protocol(backend):
    exe_module = importlib.import_module(_EXE)
    problems = []
    for cls in _executor_classes(backend):
        for _, qualname, reference, _ in _PROTOCOL_METHODS:
            method = qualname.split(".", 1)[1]
            stub = _compile_stub(exe_module, reference)
            found = signature_problems(inspect.signature(getattr(cls, method)), inspect.signature(stub))
            problems += [f"{cls.__name__}.{method}: {p}" for p in found]
        for attr in ("backend_name", "supports_inter_replica_network"):
            if not hasattr(cls, attr):
                problems.append(f"{cls.__name__}.{attr} is missing (a class attribute)")
    assert not problems, "\n  ".join(problems)


def _sig_id(row) -> str:
    return f"{row[0].removeprefix('composer_replication.')}:{row[1]}"


@pytest.mark.parametrize("row", SIGNATURES, ids=_sig_id)
def test_signature(row):
    module_name, qualname, reference, kind = row
    module, obj = _resolve(module_name, qualname)
    stub = _compile_stub(module, reference)
    problems = signature_problems(inspect.signature(obj), inspect.signature(stub))
    if kind == "async":
        if not inspect.iscoroutinefunction(obj):
            problems.append("must be an `async def` (the reference awaits it)")
    if kind == "static":
        owner_name, attr = qualname.rsplit(".", 1)
        _, owner = _resolve(module_name, owner_name)
        if not isinstance(inspect.getattr_static(owner, attr), staticmethod):
            problems.append("must be a @staticmethod")
    assert not problems, f"{module_name}.{qualname}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------------------------------
# Dataclasses and TypedDicts, as the reference writes them.
# ---------------------------------------------------------------------------------------------------

DATACLASSES: list[tuple[str, str, str]] = [
    (
        "composer_replication.loss",
        "LossComponents",
        """
        @dataclass
        class LossComponents:
         lm_ce: torch.Tensor
         sdpo_jsd: torch.Tensor
         trace_replay_dpo: torch.Tensor
         total: torch.Tensor
        """,
    ),
    (
        "composer_replication.ingestion.claude_code",
        "IngestionStats",
        """
        @dataclass
        class IngestionStats:
         n_records_total: int = 0
         n_records_skipped: int = 0
         n_states_emitted: int = 0
         n_assistant_turns: int = 0
         n_tool_use_blocks: int = 0
         n_text_blocks: int = 0
         skipped_subagent: int = 0
         skipped_summary: int = 0
         skipped_truncated_lines: int = 0
         version_warnings: list[str] | None = None # initialized to [] in __post_init__
        """,
    ),
    (
        "composer_replication.replaysim",
        "NormalizedDPOPair",
        """
        @dataclass
        class NormalizedDPOPair:
         state_id: str
         state_messages: list[dict[str, Any]]
         chosen_messages: list[dict[str, Any]]
         rejected_messages: list[dict[str, Any]]
         n_teachers_agreeing: int
         metadata: dict[str, Any]
        """,
    ),
    (
        "composer_replication.trainer.data_collator",
        "CollatorConfig",
        """
        @dataclass
        class CollatorConfig:
         max_seq_len: int = 4096
         max_dpo_seq_len: int = 2048
         pad_token_id: int = 0
         ignore_index: int = -100
         enable_sdpo: bool = True
         hint_generator: Callable[[str, dict], str | None] | None = None
         enable_replay_dpo: bool = True
         rlvr_reward_key: str = "final_reward"
        """,
    ),
    (
        "composer_replication.trainer.data_collator",
        "ComposerDataCollator",
        """
        @dataclass
        class ComposerDataCollator:
         tokenizer: TokenizerLike
         config: CollatorConfig = field(default_factory=CollatorConfig)
        """,
    ),
    (
        "composer_replication.diloco.serverless.executor",
        "ReplicaHandle",
        """
        @dataclass
        class ReplicaHandle:
         rank: int
         backend_name: str
         metadata: dict[str, Any] = field(default_factory=dict)
        """,
    ),
]


def _field_default(f: dataclasses.Field):
    if f.default is not MISSING:
        return ("value", f.default)
    if f.default_factory is not MISSING:
        return ("factory ->", f.default_factory())
    return ("required", None)


@pytest.mark.parametrize("row", DATACLASSES, ids=lambda r: r[1])
def test_dataclass_fields(row):
    module_name, name, reference = row
    module, actual = _resolve(module_name, name)
    expected = _compile_stub(module, reference)
    assert dataclasses.is_dataclass(actual), f"{module_name}.{name} must be a dataclass"
    exp = [(f.name, _field_default(f)) for f in dataclasses.fields(expected) if f.init]
    act_fields = [f for f in dataclasses.fields(actual) if f.init]
    act = [(f.name, _field_default(f)) for f in act_fields]
    problems = []
    if act[: len(exp)] != exp:
        problems.append(f"fields expected {exp}\n    got {act[: len(exp)]}")
    for f in act_fields[len(exp) :]:
        if _field_default(f)[0] == "required":
            problems.append(f"extra field {f.name!r} has no default (breaks positional construction)")
    assert not problems, f"{module_name}.{name}:\n  " + "\n  ".join(problems)


TYPEDDICTS: list[tuple[str, str, str]] = [
    (
        "composer_replication.teacher_replay",
        "TeacherSpec",
        """
        class TeacherSpec(TypedDict):
         slug: str
         input_per_mtok: float
         output_per_mtok: float
        """,
    ),
    (
        "composer_replication.teacher_replay",
        "TraceState",
        """
        class TraceState(TypedDict):
         state_id: str # unique within the trace
         messages: list[dict] # OpenAI-style chat history up to (and incl.) this user prompt
         student_action: str # what the student actually did at this step
        """,
    ),
    (
        "composer_replication.teacher_replay",
        "TeacherCallResult",
        """
        class TeacherCallResult(TypedDict):
         state_id: str
         teacher_slug: str
         response_text: str | None # None on error
         latency_s: float
         prompt_tokens: int
         completion_tokens: int
         cost_usd: float
         error: str | None # None on success
        """,
    ),
    (
        "composer_replication.teacher_replay",
        "DPOPair",
        """
        class DPOPair(TypedDict):
         state_id: str
         state_messages: list[dict]
         chosen: str # teacher-consensus action
         rejected: str # student action
         n_teachers_agreeing: int
        """,
    ),
    (
        "composer_replication.hint_generator",
        "HintContext",
        """
        class HintContext(TypedDict, total=False):
         error_kind: str
         error_message: str
         available_tools: list[str]
         tool_name: str
         tool_schema: dict
         intent: str
        """,
    ),
    (
        "composer_replication.trainer.data_collator",
        "TraceTurn",
        """
        class TraceTurn(TypedDict, total=False):
         role: str # "user" | "assistant" | "tool"
         content: str
         tool_call: dict | None
         tool_error: str | None
         error_meta: dict
        """,
    ),
    (
        "composer_replication.trainer.data_collator",
        "TraceExample",
        """
        class TraceExample(TypedDict, total=False):
         trace_id: str
         turns: list[TraceTurn]
         final_reward: float
         dpo_pairs: list[dict] | None
        """,
    ),
]


@pytest.mark.parametrize("row", TYPEDDICTS, ids=lambda r: r[1])
def test_typeddict_keys(row):
    module_name, name, reference = row
    module, actual = _resolve(module_name, name)
    expected = _compile_stub(module, reference)
    assert typing.is_typeddict(actual), f"{module_name}.{name} must be a TypedDict"
    exp_keys = list(expected.__annotations__)
    act_keys = list(actual.__annotations__)
    problems = []
    if act_keys[: len(exp_keys)] != exp_keys:
        problems.append(f"keys expected {exp_keys}, got {act_keys}")
    if set(actual.__required_keys__) != set(expected.__required_keys__):
        problems.append(
            f"required keys expected {sorted(expected.__required_keys__)}, "
            f"got {sorted(actual.__required_keys__)}"
        )
    assert not problems, f"{module_name}.{name}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------------------------------
# §1 re-exports and the symbols each section names (identity with the source module).
# ---------------------------------------------------------------------------------------------------

TOP_LEVEL = {
    "compose_loss": "composer_replication.loss",
    "LossComponents": "composer_replication.loss",
    "build_batch": "composer_replication.batch",
    "generalized_jsd_loss": "composer_replication.opsd",
    "ClaudeCodeIngester": "composer_replication.ingestion.claude_code",
    "IngestionStats": "composer_replication.ingestion.claude_code",
    "SYSTEM_PROMPT": "composer_replication.ingestion.claude_code",
    "DEFAULT_TEACHERS": "composer_replication.teacher_replay",
    "DPOPair": "composer_replication.teacher_replay",
    "TeacherCallResult": "composer_replication.teacher_replay",
    "TeacherSpec": "composer_replication.teacher_replay",
    "TraceState": "composer_replication.teacher_replay",
    "extract_dpo_pairs": "composer_replication.teacher_replay",
    "replay_trace": "composer_replication.teacher_replay",
    "ComposerReplicationTrainer": "composer_replication.trainer",
    # §10: "Exported from both composer_replication and composer_replication.trainer".
    "make_dr_grpo_config": "composer_replication.trainer",
    "make_po_config": "composer_replication.trainer",
    "PO_OBJECTIVES": "composer_replication.trainer",
}


@pytest.mark.parametrize("name", sorted(TOP_LEVEL))
def test_top_level_reexport(name):
    import composer_replication

    source = importlib.import_module(TOP_LEVEL[name])
    assert hasattr(source, name), f"{TOP_LEVEL[name]}.{name} is missing"
    assert getattr(composer_replication, name) is getattr(source, name)


# Same object from each module that the reference (or its examples) imports it from.
SAME_OBJECT: list[tuple[str, str, str]] = [
    ("composer_replication.replaysim", "DPOPair", "composer_replication.teacher_replay"),
    ("composer_replication.replaysim", "TeacherCallResult", "composer_replication.teacher_replay"),
    ("composer_replication.replaysim", "extract_dpo_pairs", "composer_replication.teacher_replay"),
    ("composer_replication.replaysim", "replay_trace", "composer_replication.teacher_replay"),
    ("composer_replication.trainer", "ComposerReplicationTrainer", _CRT),
    ("composer_replication.diloco.serverless", "ReplicaHandle", _EXE),
    ("composer_replication.diloco.serverless", "ServerlessExecutor", _EXE),
    ("composer_replication.distillation", "simpo_loss", "composer_replication.distillation.simpo"),
    ("composer_replication.distillation", "taid_loss", "composer_replication.distillation.taid"),
    (
        "composer_replication.distillation",
        "entropy_aware_opd_loss",
        "composer_replication.distillation.entropy_aware_opd",
    ),
]


@pytest.mark.parametrize("row", SAME_OBJECT, ids=lambda r: f"{r[0]}.{r[1]}")
def test_same_object(row):
    where, name, source = row
    a = getattr(importlib.import_module(where), name, None)
    b = getattr(importlib.import_module(source), name, None)
    assert a is not None, f"{where}.{name} is missing"
    assert a is b, f"{where}.{name} is not {source}.{name}"


# Every module §1–§12 documents, and the modules §13–§17 name, imports.
MODULES = [
    "composer_replication",
    "composer_replication.loss",
    "composer_replication.batch",
    "composer_replication.opsd",
    "composer_replication.distillation",
    "composer_replication.distillation.simpo",
    "composer_replication.distillation.taid",
    "composer_replication.distillation.entropy_aware_opd",
    "composer_replication.teacher_replay",
    "composer_replication.replaysim",
    "composer_replication.replaysim.normalize",
    "composer_replication.ingestion",
    "composer_replication.ingestion.claude_code",
    "composer_replication.hint_generator",
    "composer_replication.trainer",
    "composer_replication.trainer.composer_trainer",
    "composer_replication.trainer.data_collator",
    "composer_replication.diloco",
    "composer_replication.diloco.serverless",
    "composer_replication.diloco.serverless.executor",
    "composer_replication.diloco.serverless.allreduce",
    "composer_replication.diloco.serverless.modal",
    "composer_replication.diloco.serverless.hf_jobs",
    "composer_replication.diloco.serverless.replica_entrypoint",
    # §13–§17 (named in the table of contents)
    "composer_replication.recipes.prime_rl.composer_loss",
    "composer_replication.recipes.monarch.actors",
    "composer_replication.diloco.serverless.eks",
    "composer_replication.diloco.serverless.sagemaker",
    "composer_replication.datagen.docker_sandbox",
    "composer_replication.safety",
    "composer_replication.safety.kill_switch",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


# ---------------------------------------------------------------------------------------------------
# Documented constants and attributes.
# ---------------------------------------------------------------------------------------------------


def test_version_and_diloco_flag():
    import composer_replication

    assert composer_replication.__version__ == "0.1.0"
    has_torchft = importlib.util.find_spec("torchft") is not None
    assert composer_replication._DILOCO_AVAILABLE is has_torchft


def test_loss_components_detached():
    import torch

    from composer_replication.loss import LossComponents

    x = torch.tensor(1.5, requires_grad=True)
    c = LossComponents(lm_ce=x * 1, sdpo_jsd=x * 2, trace_replay_dpo=x * 3, total=x * 4)
    d = c.detached()
    assert d == {"lm_ce": 1.5, "sdpo_jsd": 3.0, "trace_replay_dpo": 4.5, "total": 6.0}
    assert all(type(v) is float for v in d.values())


def test_default_teachers():
    from composer_replication.teacher_replay import DEFAULT_TEACHERS

    assert [t["slug"] for t in DEFAULT_TEACHERS] == [
        "anthropic/claude-opus-4.7",
        "openai/gpt-5",
        "deepseek/deepseek-v4-pro",
    ]
    for t in DEFAULT_TEACHERS:
        assert isinstance(t["input_per_mtok"], float) and t["input_per_mtok"] > 0, t
        assert isinstance(t["output_per_mtok"], float) and t["output_per_mtok"] > 0, t


def test_system_prompt_head():
    from composer_replication.ingestion.claude_code import SYSTEM_PROMPT

    assert SYSTEM_PROMPT.startswith(
        "You are a senior software engineer working as a coding agent in a terminal environment"
    )


def test_ingestion_stats_version_warnings_list():
    from composer_replication import IngestionStats

    a, b = IngestionStats(n_records_total=5), IngestionStats()
    assert a.version_warnings == [] and b.version_warnings == []
    assert a.version_warnings is not b.version_warnings


def test_claude_code_ingester_state_ids_and_stats():
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester, IngestionStats

    path = Path(__file__).parent / "data" / "sessions" / "claude_code" / "marot__spotter__short.jsonl"
    ing = ClaudeCodeIngester()
    states = list(ing.ingest(path))
    assert states, "the short session yields at least one state"
    assert [s["state_id"] for s in states] == [f"{path.stem}::{i:04d}" for i in range(len(states))]
    assert isinstance(ing.last_stats, IngestionStats)
    assert ing.last_stats.n_states_emitted == len(states)


def test_hint_templates_and_dispatch():
    from composer_replication import hint_generator as hg

    kinds = ("tool_not_found", "json_decode", "type_error", "runtime_error", "repeated_failure")
    assert set(kinds) <= set(hg.HINT_TEMPLATES), sorted(hg.HINT_TEMPLATES)
    for kind in kinds:
        fn = hg.HINT_TEMPLATES[kind]
        assert fn is getattr(hg, f"hint_{kind}")
        text = hg.dispatch(kind)
        assert isinstance(text, str) and text, kind
    assert hg.dispatch("no_such_error_kind_for_api_test") is None
    hg.register("api_surface_test_kind", lambda ctx: "Reminder: try X.")
    try:
        assert hg.dispatch("api_surface_test_kind") == "Reminder: try X."
    finally:
        hg.HINT_TEMPLATES.pop("api_surface_test_kind", None)


def test_taid_scheduler_t_is_a_property():
    from composer_replication.distillation import TAIDScheduler

    assert isinstance(inspect.getattr_static(TAIDScheduler, "t"), property)
    sched = TAIDScheduler(num_train_steps=10)
    assert isinstance(sched.t, float) and sched.t == pytest.approx(0.4)


def test_teacher_entropy_in_all():
    from composer_replication.distillation import entropy_aware_opd

    assert "teacher_entropy" in entropy_aware_opd.__all__


def test_dj_normalizer_default_recipe_on_disk():
    from composer_replication.replaysim import DJNormalizer

    recipe = DJNormalizer.DEFAULT_RECIPE
    assert isinstance(recipe, Path)
    assert recipe.parts[-4:] == ("composer_replication", "recipes", "replaysim", "default.yaml")
    assert recipe.is_file()


# PO_OBJECTIVES table (§10): loss_type, scale_rewards, distinguishing knob(s).
PO_TABLE = {
    "grpo": {"loss_type": "grpo", "scale_rewards": "group", "importance_sampling_level": "token"},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "bnpo": {"loss_type": "bnpo", "scale_rewards": "batch"},
    "dapo": {
        "loss_type": "dapo",
        "scale_rewards": "none",
        "epsilon_high": 0.28,
        "mask_truncated_completions": True,
        "beta": 0.0,
    },
    "gspo": {"loss_type": "grpo", "scale_rewards": "group", "importance_sampling_level": "sequence"},
    "cispo": {"loss_type": "cispo", "scale_rewards": "none", "epsilon_high": 5.0},
}


@pytest.mark.parametrize("objective", sorted(PO_TABLE))
def test_po_objectives_presets(objective):
    from composer_replication.trainer import PO_OBJECTIVES

    assert objective in PO_OBJECTIVES, sorted(PO_OBJECTIVES)
    preset = PO_OBJECTIVES[objective]
    for key, value in PO_TABLE[objective].items():
        assert preset.get(key) == value, f"PO_OBJECTIVES[{objective!r}][{key!r}]: {preset.get(key)!r}"


@pytest.mark.parametrize("objective", sorted(PO_TABLE))
def test_make_po_config_builds_the_table(objective, tmp_path):
    pytest.importorskip("trl")
    from composer_replication.trainer import make_po_config

    cfg = make_po_config(objective, output_dir=str(tmp_path), report_to="none")
    for key, value in PO_TABLE[objective].items():
        assert getattr(cfg, key) == value, f"{objective}: GRPOConfig.{key} = {getattr(cfg, key)!r}"


def test_make_dr_grpo_config_forces_the_recipe(tmp_path):
    pytest.importorskip("trl")
    from composer_replication.trainer import make_dr_grpo_config

    cfg = make_dr_grpo_config(output_dir=str(tmp_path), learning_rate=1e-6, report_to="none")
    assert (cfg.loss_type, cfg.scale_rewards, cfg.num_iterations) == ("dr_grpo", "none", 1)
    assert cfg.learning_rate == 1e-6


def test_trainer_subclasses_grpo_trainer():
    trl = pytest.importorskip("trl")
    from composer_replication.trainer import ComposerReplicationTrainer

    assert issubclass(ComposerReplicationTrainer, trl.GRPOTrainer)


def test_diloco_module_attributes():
    from composer_replication import diloco

    for name in ("DiLoCo", "Manager", "_DummyWork", "_TORCHFT_AVAILABLE"):
        assert hasattr(diloco, name), f"composer_replication.diloco.{name} is missing"
    has_torchft = importlib.util.find_spec("torchft") is not None
    assert diloco._TORCHFT_AVAILABLE is has_torchft
    if has_torchft:
        import torchft.local_sgd
        import torchft.manager
        import torchft.work

        assert diloco.DiLoCo is torchft.local_sgd.DiLoCo
        assert diloco.Manager is torchft.manager.Manager
        assert diloco._DummyWork is torchft.work._DummyWork
    else:
        assert diloco.DiLoCo is None and diloco.Manager is None and diloco._DummyWork is None


def test_serverless_executor_protocol():
    from composer_replication.diloco.serverless.executor import ServerlessExecutor

    assert getattr(ServerlessExecutor, "_is_runtime_protocol", False), "must be @runtime_checkable"
    hints = ServerlessExecutor.__annotations__
    assert {"backend_name", "supports_inter_replica_network"} <= set(hints), hints


def test_kill_switch_contract():
    """§17 is only named; the shared contract in the team brief fixes these names."""
    from composer_replication.safety import kill_switch as ks

    assert ks.EXIT_KILL_SWITCH == 3
    assert issubclass(ks.KillSwitchTriggered, RuntimeError)
    err = ks.KillSwitchTriggered("spend cap")
    assert err.reason == "spend cap" and err.exit_code == 3
    for method, params in (
        ("observe", ["self", "metrics"]),
        ("record_violation", ["self", "kind", "detail"]),
        ("should_stop", ["self"]),
    ):
        sig = inspect.signature(getattr(ks.KillSwitch, method))
        assert list(sig.parameters)[: len(params)] == params, f"KillSwitch.{method}{sig}"
    assert inspect.signature(ks.KillSwitch.observe).parameters["metrics"].kind is P.VAR_KEYWORD


# ---------------------------------------------------------------------------------------------------
# Documented errors.
# ---------------------------------------------------------------------------------------------------


@pytest.fixture()
def _one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def batch(tiny_tokenizer, _one_thread):
    from composer_replication.batch import build_batch

    return build_batch(tiny_tokenizer, align_sdpo_shapes=True)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dpo_variant": "ipo"}, "dpo_variant"),
        ({"sdpo_wrapper": "bogus"}, "sdpo_wrapper"),
        ({"sdpo_wrapper": "taid"}, "taid_t"),
        ({"sdpo_wrapper": "taid", "taid_t": 1.5}, "taid_t"),
        ({"sdpo_wrapper": "taid", "taid_t": -0.1}, "taid_t"),
    ],
    ids=["dpo_variant", "sdpo_wrapper", "taid_missing_t", "taid_t_above_1", "taid_t_below_0"],
)
def test_compose_loss_value_errors(tiny_model, batch, kwargs, match):
    from composer_replication.loss import compose_loss

    with pytest.raises(ValueError, match=match):
        compose_loss(tiny_model, batch, **kwargs)


def test_build_batch_unknown_variant(tiny_tokenizer):
    from composer_replication.batch import build_batch

    with pytest.raises(ValueError):
        build_batch(tiny_tokenizer, variant="no_such_variant")


def test_generalized_jsd_unknown_reduction():
    import torch

    from composer_replication.opsd import generalized_jsd_loss

    s, t = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    with pytest.raises(ValueError):
        generalized_jsd_loss(s, t, reduction="bogus")


def test_simpo_shape_mismatch():
    import torch

    from composer_replication.distillation import simpo_loss

    with pytest.raises(ValueError):
        simpo_loss(torch.zeros(2), torch.zeros(3))


def test_taid_shape_mismatch():
    import torch

    from composer_replication.distillation import taid_loss

    with pytest.raises(ValueError):
        taid_loss(torch.randn(2, 3, 5), torch.randn(2, 3, 6), t=0.5)


@pytest.mark.parametrize("case", ["logits", "labels", "reduction"])
def test_entropy_aware_opd_errors(case):
    import torch

    from composer_replication.distillation import entropy_aware_opd_loss

    s, t = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    kwargs: dict = {}
    if case == "logits":
        t = torch.randn(2, 4, 5)
    elif case == "labels":
        kwargs["labels"] = torch.ones(2, 4)
    else:
        kwargs["reduction"] = "bogus"
    with pytest.raises(ValueError):
        entropy_aware_opd_loss(s, t, **kwargs)


def test_make_po_config_unknown_objective_lists_menu():
    from composer_replication.trainer import PO_OBJECTIVES, make_po_config

    with pytest.raises(ValueError) as info:
        make_po_config("no_such_objective")
    for name in PO_OBJECTIVES:
        assert name in str(info.value)


def test_dj_normalizer_missing_recipe(tmp_path):
    from composer_replication.replaysim import DJNormalizer

    missing = tmp_path / "no_such_recipe.yaml"
    if importlib.util.find_spec("data_juicer") is not None:
        with pytest.raises(FileNotFoundError):
            DJNormalizer(recipe_path=missing)
    else:  # the reference documents RuntimeError for a missing data_juicer
        with pytest.raises((FileNotFoundError, RuntimeError)):
            DJNormalizer(recipe_path=missing)


def test_replay_trace_without_key(tmp_path, monkeypatch):
    from composer_replication.teacher_replay import DEFAULT_TEACHERS, replay_trace

    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.hermes/.env either
    monkeypatch.chdir(tmp_path)
    state = {"state_id": "t::0000", "messages": [{"role": "user", "content": "hi"}], "student_action": "x"}
    with pytest.raises(RuntimeError):
        asyncio.run(replay_trace([state], teachers=DEFAULT_TEACHERS[:1], max_total_usd=0.01))
