"""The backend protocol and its request/response records (the dispatch on ``backend`` is `factory`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from composer_replication.config.run import REPLAY_TIMEOUT_S

BILLED_NOTHING = "nothing"  # the request was refused or never reached the server
BILLED_UNKNOWN = "unknown"  # it may have been processed and billed: book the full reservation


@dataclass
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    temperature: float = 0.0
    timeout_s: float = REPLAY_TIMEOUT_S
    extra_body: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # OpenAI function-tool schemas, sent as ``tools`` when set


@dataclass
class ChatResponse:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None  # as billed by the server (OpenRouter ``usage.cost``); None if not reported
    finish_reason: str | None = None  # "stop", "length", "tool_calls", ... as the server says
    tool_calls: list[Any] | None = None  # the server's own parsed calls (OpenAI ``message.tool_calls``)
    logprobs: list[float] | None = None  # per generated token, when asked (``logprobs: true``)


class TeacherError(Exception):
    """A failed call. ``retryable`` errors are retried with backoff; ``billed`` says how to book it."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        billed: str = BILLED_NOTHING,
        retry_after_s: float | None = None,
        cost_usd: float | None = None,
        fatal: bool = False,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.billed = billed
        self.retry_after_s = retry_after_s
        self.cost_usd = cost_usd
        self.fatal = fatal  # stop dispatching the whole run (e.g. HTTP 402: the key's limit is reached)


class Backend(Protocol):
    async def complete(self, request: ChatRequest) -> ChatResponse: ...

    async def aclose(self) -> None: ...
