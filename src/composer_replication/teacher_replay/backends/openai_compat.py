"""OpenAI-compatible chat completions over httpx: OpenRouter, vLLM, Ollama, llama.cpp server.

What is covered: one non-streaming POST per call with ``max_tokens`` always set (the ledger's worst
case depends on it); OpenRouter's ``usage.cost`` read as the billed amount; error bodies recognised
whether they come with an error status or with HTTP 200; ``Retry-After`` passed to the retry loop.

What is not covered: streaming, tool-calling via the ``tools`` field (teachers answer in the agent's
text action format instead, which every server supports), reading live prices.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from .base import BILLED_NOTHING, BILLED_UNKNOWN, ChatRequest, ChatResponse, TeacherError

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"
_SHARD = 2
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})


def _import_httpx():
    try:
        import httpx
    except ImportError as exc:  # pragma: no cover - httpx ships with the replay extra
        raise ImportError(
            "teacher replay over HTTP needs httpx: pip install 'composer-replication[replay]'"
        ) from exc
    return httpx


def _retry_after(headers: Any) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            import time

            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _error_from_body(body: dict[str, Any], status: int) -> TeacherError:
    err = body.get("error")
    if not isinstance(err, dict):
        err = {"message": str(err)}
    code = err.get("code")
    try:
        code = int(code)
    except (TypeError, ValueError):
        code = status
    meta = err.get("metadata") if isinstance(err.get("metadata"), dict) else {}
    etype = meta.get("error_type", "")
    msg = (
        f"HTTP {status}"
        + (f" error {code}" if code != status else "")
        + f": {str(err.get('message', ''))[:300]}"
    )
    retryable = code in RETRYABLE_STATUS or etype in ("rate_limit_exceeded", "timeout")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    cost = usage.get("cost")
    return TeacherError(
        msg,
        retryable=retryable,
        billed=BILLED_NOTHING,
        cost_usd=float(cost) if isinstance(cost, (int, float)) else None,
        fatal=code == 402,
    )


class OpenAICompatBackend:
    def __init__(self, spec: dict[str, Any], *, api_key: str | None, concurrency: int) -> None:
        httpx = _import_httpx()
        self._httpx = httpx
        self.base_url = spec.get("base_url", OPENROUTER_BASE_URL).rstrip("/")
        self.is_openrouter = self.base_url.startswith(OPENROUTER_BASE_URL)
        self._url = httpx.URL(f"{self.base_url}/chat/completions")  # parsed once, not per request
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if self.is_openrouter:
            headers["X-OpenRouter-Title"] = "composer-replication"
        # httpcore's pool scans (and polls) every connection each time a request is assigned, so one
        # pool of N connections costs O(N) syscalls per request. Shards of <= 2 connections, each
        # request sent on the least busy shard, keep that cost flat as the concurrency grows.
        n_shards = max(1, -(-concurrency // _SHARD))
        per = -(-concurrency // n_shards)
        limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
        ssl_ctx = httpx.create_ssl_context()  # built once: loading the CA bundle costs ~0.1 s per client
        self._clients = [
            httpx.AsyncClient(headers=headers, limits=limits, timeout=None, verify=ssl_ctx)
            for _ in range(n_shards)
        ]
        self._busy = [0] * n_shards
        self._timeouts: dict[float, Any] = {}
        self.spec = spec

    def _body(self, req: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": req.model,
            "messages": req.messages,
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "stream": False,
        }
        if self.is_openrouter:
            # Route only to models whose terms allow training on outputs, and never above the planned price.
            body["provider"] = {
                "enforce_distillable_text": True,
                "max_price": {
                    "prompt": self.spec["input_per_mtok"],
                    "completion": self.spec["output_per_mtok"],
                },
            }
        body.update(req.extra_body)
        return body

    def _timeout(self, seconds: float) -> Any:
        """One ``httpx.Timeout`` per distinct value (built once, not per request)."""
        t = self._timeouts.get(seconds)
        if t is None:
            t = self._timeouts[seconds] = self._httpx.Timeout(seconds)
        return t

    async def complete(self, req: ChatRequest) -> ChatResponse:
        httpx = self._httpx
        shard = min(range(len(self._clients)), key=self._busy.__getitem__)
        self._busy[shard] += 1
        try:
            resp = await self._clients[shard].post(
                self._url, content=orjson.dumps(self._body(req)), timeout=self._timeout(req.timeout_s)
            )
        except httpx.ConnectError as exc:
            raise TeacherError(f"connect error: {exc}", retryable=True, billed=BILLED_NOTHING) from None
        except httpx.TimeoutException:
            raise TeacherError(
                f"timeout after {req.timeout_s}s", retryable=True, billed=BILLED_UNKNOWN
            ) from None
        except httpx.TransportError as exc:
            raise TeacherError(
                f"transport error: {type(exc).__name__}", retryable=True, billed=BILLED_UNKNOWN
            ) from None
        finally:
            self._busy[shard] -= 1
        try:
            body = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            body = None
        if resp.status_code != 200:
            retry_after = _retry_after(resp.headers)
            if isinstance(body, dict) and "error" in body:
                err = _error_from_body(body, resp.status_code)
            else:
                err = TeacherError(
                    f"HTTP {resp.status_code}: {resp.text[:200]!r}",
                    retryable=resp.status_code in RETRYABLE_STATUS,
                    fatal=resp.status_code == 402,
                )
            err.retry_after_s = retry_after
            raise err
        if not isinstance(body, dict):
            # A 200 we cannot read may still have been generated and billed.
            raise TeacherError("HTTP 200 with a body that is not JSON", retryable=True, billed=BILLED_UNKNOWN)
        if "error" in body and body["error"]:
            raise _error_from_body(body, 200)
        try:
            choice = body["choices"][0]
            text = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise TeacherError(
                "HTTP 200 without choices[0].message.content", retryable=True, billed=BILLED_UNKNOWN
            ) from None
        if choice.get("finish_reason") == "error":
            raise TeacherError("provider error (finish_reason=error)", retryable=True, billed=BILLED_UNKNOWN)
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
        if usage is None:
            raise TeacherError("HTTP 200 without usage", retryable=False, billed=BILLED_UNKNOWN)
        cost = usage.get("cost")
        return ChatResponse(
            text=text if isinstance(text, str) else json.dumps(text),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            cost_usd=float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
        )

    async def aclose(self) -> None:
        for c in self._clients:
            await c.aclose()
