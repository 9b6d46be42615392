"""Any OpenAI-compatible endpoint as a generation engine: the HTTP twin of ``generation.LocalEngine``.

:class:`OpenAIEndpoint` drives ``transformers serve``, vLLM, llama.cpp's server or a provider through
the teacher replay's client (``backends.openai_compat``: one deadline per attempt, body size cap, key
scrubbing, error classification) and returns the engine's own record,
``generation.types.Completion``, for rollouts (``datagen.rollout.EndpointPolicy``), evaluation
(``trainer.evaluation.greedy.GreedyGenerator(engine=...)``) or anything else that asks a model. A server's own
tool calls come back in ``Completion.tool_calls``; ``generation.types.tool_calls`` reads them and an
in-process answer the same way, through ``wire``.

What is covered: the parameters of ``GenerationParams`` sent as the chat-completions fields
(``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``logprobs``; ``top_k`` and
``repetition_penalty`` as the vLLM extensions, only when set); retries of retryable failures with the
replay's backoff (``RetryPolicy``, honouring ``Retry-After``); conversations of one call sent
concurrently; synchronous (``complete``) and asynchronous (``acomplete``) use.

What is not covered: spend. Nothing here books a cost against a cap: paid providers belong to the teacher
replay (``replay_states``), whose ledger does. An OpenRouter URL is refused unless its prices are given,
because OpenRouter routing is capped at the prices in the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from composer_replication.generation.types import Completion, GenerationParams

from .backends.base import ChatRequest, ChatResponse, TeacherError
from .backends.openai_compat import OPENROUTER_BASE_URL, OpenAICompatBackend
from .client import RetryPolicy

__all__ = ["OpenAIEndpoint", "to_completion"]


def to_completion(resp: ChatResponse) -> Completion:
    """A backend's ``ChatResponse`` as the engine's ``Completion`` (``finish_reason`` "length" only when
    the server says the budget cut the answer)."""
    return Completion(
        text=resp.text,
        finish_reason="length" if resp.finish_reason == "length" else "stop",
        prompt_tokens=resp.prompt_tokens,
        completion_tokens=resp.completion_tokens,
        logprobs=resp.logprobs,
        tool_calls=resp.tool_calls,
        cost_usd=resp.cost_usd,
        extra={"server_finish_reason": resp.finish_reason},
    )


def request_fields(params: GenerationParams) -> dict[str, Any]:
    """The chat-completions fields for ``params`` beyond ``max_tokens`` and ``temperature``."""
    body: dict[str, Any] = {}
    if params.top_p is not None:
        body["top_p"] = params.top_p
    if params.top_k:
        body["top_k"] = params.top_k
    if params.repetition_penalty != 1.0:
        body["repetition_penalty"] = params.repetition_penalty
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.logprobs:
        body["logprobs"] = True
    return body


class OpenAIEndpoint:
    """``complete(conversations, params) -> list[Completion]`` against ``base_url`` (``.../v1``) for
    ``model``. ``prices``: ($ per million input tokens, per million output tokens), needed for OpenRouter
    only; ``extra_body``: more request fields (e.g. ``tools``), sent with every request."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        concurrency: int = 4,
        retry: RetryPolicy | None = None,
        prices: tuple[float, float] | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if base_url.startswith(OPENROUTER_BASE_URL) and prices is None:
            raise ValueError(
                "OpenAIEndpoint: an OpenRouter base_url needs prices=(input $/Mtok, output $/Mtok); "
                "paid teachers with a spend cap go through the replay (composer-replication replay)"
            )
        pin, pout = prices or (0.0, 0.0)
        spec = {"slug": model, "base_url": base_url, "input_per_mtok": pin, "output_per_mtok": pout}
        self.model, self.timeout_s = model, timeout_s
        self.retry = retry or RetryPolicy()
        self.extra_body = dict(extra_body or {})
        self._backend = OpenAICompatBackend(spec, api_key=api_key, concurrency=concurrency)
        self._loop: asyncio.AbstractEventLoop | None = None

    def complete(
        self, conversations: Sequence[list[dict[str, Any]]], params: GenerationParams
    ) -> list[Completion]:
        """One answer per conversation (synchronous; not from inside a running event loop)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()  # one loop for the client's lifetime: its pool lives there
        return self._loop.run_until_complete(self.acomplete(conversations, params))

    async def acomplete(
        self, conversations: Sequence[list[dict[str, Any]]], params: GenerationParams
    ) -> list[Completion]:
        return list(await asyncio.gather(*(self._one(list(m), params) for m in conversations)))

    async def _one(self, messages: list[dict[str, Any]], params: GenerationParams) -> Completion:
        req = ChatRequest(
            model=self.model,
            messages=messages,
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            timeout_s=self.timeout_s,
            extra_body={**request_fields(params), **self.extra_body},
        )
        attempt = 0
        while True:
            attempt += 1
            try:
                return to_completion(await self._backend.complete(req))
            except TeacherError as err:
                if not err.retryable or err.fatal or attempt >= self.retry.max_attempts:
                    raise
                await asyncio.sleep(self.retry.delay(attempt - 1, err.retry_after_s))

    def close(self) -> None:
        loop = self._loop or asyncio.new_event_loop()
        loop.run_until_complete(self._backend.aclose())
        loop.close()
        self._loop = None

    def __enter__(self) -> OpenAIEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
