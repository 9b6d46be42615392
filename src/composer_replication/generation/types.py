"""What a generation is asked for and what it returns, the same for the in-process engine and an endpoint.

No torch here: the HTTP path (``teacher_replay.endpoint``) and the callers that only read completions
import these records without the model stack.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from composer_replication import wire

__all__ = ["Completion", "GenerationParams", "action_text", "tool_calls"]


@dataclass(frozen=True)
class GenerationParams:
    """How to continue a prompt.

    ``temperature == 0`` is greedy (argmax); otherwise tokens are drawn from ``softmax(logits /
    temperature)`` after ``top_k`` / ``top_p`` filtering (``None``: no filter), in the order and with the
    arithmetic of ``transformers``' ``generate``. ``repetition_penalty`` (1.0: none) is ``generate``'s
    too, and applies to greedy decoding as well. ``seed`` (sampling only): draws come from a private
    generator seeded with it (the global RNG is not touched); ``None`` draws from the global RNG of the
    model's device, as ``generate`` does. A row ends at an end-of-turn token (kept in ``token_ids``), at
    the first of ``stop`` (cut from ``text``, as OpenAI servers do) or after ``max_new_tokens``.
    ``logprobs``: also return each generated token's log-probability under the model (raw logits, before
    temperature and filtering).
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if isinstance(self.stop, str):
            raise ValueError("stop must be a tuple of strings, not one string")


@dataclass
class Completion:
    """One generated answer. ``finish_reason``: ``"stop"`` (an end-of-turn token, a stop string or, over
    HTTP, a tool call) or ``"length"`` (cut by ``max_new_tokens``). ``token_ids`` and ``logprobs`` are
    None where an endpoint does not return them; ``tool_calls`` holds an endpoint's own parsed calls
    (OpenAI ``message.tool_calls``), None in process: read calls with :func:`tool_calls` either way."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tool_calls: list[Any] | None = None
    cost_usd: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """False when the token budget cut the answer."""
        return self.finish_reason != "length"


def _server_call_text(call: Any) -> str:
    """One OpenAI ``tool_calls`` entry as the wire format's tool line. Arguments that are not a JSON
    object stay what they were (a string, a list), so ``wire`` reads the call back as malformed; a call
    without a usable name becomes ``_invalid`` with the reason (what ``wire.tool_calls`` does to a
    tool line it cannot read)."""
    fn = call.get("function") if isinstance(call, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(fn, dict) or not isinstance(name, str) or not re.fullmatch(r"\s*\S+\s*", name):
        raw = json.dumps(call, ensure_ascii=False, default=str)[:500]
        return wire.format_tool_use(
            "_invalid", {"raw": raw, "error": f"server tool call without a usable name: {raw[:80]}"}
        )
    args: Any = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass  # kept as the string: not an object, so wire reports it
    return wire.format_tool_use(name.strip(), args)


def action_text(completion: Completion) -> str:
    """The answer as action text in the ``wire`` format: the text, then an endpoint's own tool calls
    (if it returned any) written as ``wire`` writes calls. What a rollout records and trains on."""
    calls = completion.tool_calls or []
    if not calls:
        return completion.text
    parts = [completion.text.strip()] if completion.text.strip() else []
    return wire.ACTION_SEP.join([*parts, *(_server_call_text(c) for c in calls)])


def tool_calls(completion: Completion) -> list[dict[str, Any]]:
    """The answer's tool calls as ``[{"name", "input"}]`` (``wire.tool_calls`` of :func:`action_text`):
    the same calls for the same text, whether the text came from the engine or an endpoint."""
    return wire.tool_calls(action_text(completion))
