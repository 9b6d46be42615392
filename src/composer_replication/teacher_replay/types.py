"""Record types of teacher replay (API reference §6) and the default teacher set."""

from typing import NotRequired, TypedDict


class TeacherSpec(TypedDict):
    """A teacher model and its price in USD per million tokens.

    Optional keys (all ``NotRequired``; documented in docs/replay.md):

    - ``backend``: ``"openai"`` (default; any OpenAI-compatible chat-completions server) or
      ``"transformers"`` (an in-process Hugging Face model, for offline use).
    - ``base_url``: the server root for ``"openai"``, e.g. ``http://127.0.0.1:8000/v1`` for vLLM or
      ``http://127.0.0.1:11434/v1`` for Ollama. Default: OpenRouter.
    - ``api_key_env``: the environment variable holding this teacher's key (default
      ``OPENROUTER_API_KEY``). Loopback/local servers need no key.
    - ``model``: the model name sent to the server, when it differs from ``slug``.
    - ``model_path``: a local model directory for ``"transformers"``.
    - ``temperature``: sampling temperature (default 0.0).
    - ``extra_body``: extra JSON fields merged into each request (e.g. ``{"reasoning": {...}}``).
    - ``tool_mode``: ``"native"`` (default; asked with ``tools``, answers read from ``tool_calls``) or
      ``"text"`` (the text action format, for endpoints without tool support).
    """

    slug: str
    input_per_mtok: float
    output_per_mtok: float
    backend: NotRequired[str]
    base_url: NotRequired[str]
    api_key_env: NotRequired[str]
    model: NotRequired[str]
    model_path: NotRequired[str]
    temperature: NotRequired[float]
    extra_body: NotRequired[dict]
    tool_mode: NotRequired[str]


class TraceState(TypedDict):
    """One step of a frozen agentic trace (see the shared student-action contract)."""

    state_id: str
    messages: list[dict]
    student_action: str


class TeacherCallResult(TypedDict):
    """One (state, teacher) call: a response, or ``error`` set and ``response_text`` None."""

    state_id: str
    teacher_slug: str
    response_text: str | None
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    error: str | None


class DPOPair(TypedDict):
    """A preference pair where teachers agreed against the student."""

    state_id: str
    state_messages: list[dict]
    chosen: str
    rejected: str
    n_teachers_agreeing: int
    tools: NotRequired[
        list[dict]
    ]  # the state's tool schemas (``tool_schemas``): the prompt is rendered with them


# Paper-baseline OpenRouter list prices (USD per million tokens). Prices drift: read them live from
# GET /api/v1/models before a large run and pass your own specs; the ledger reconciles with the
# provider-reported ``usage.cost`` either way.
DEFAULT_TEACHERS: list[TeacherSpec] = [
    {"slug": "anthropic/claude-opus-4.7", "input_per_mtok": 15.0, "output_per_mtok": 75.0},
    {"slug": "openai/gpt-5", "input_per_mtok": 1.25, "output_per_mtok": 10.0},
    {"slug": "deepseek/deepseek-v4-pro", "input_per_mtok": 0.55, "output_per_mtok": 2.19},
]
