"""OpenAI-compatible chat completions over httpx: OpenRouter, vLLM, Ollama, llama.cpp server.

What is covered: one non-streaming POST per call with ``max_tokens`` always set (the ledger's worst
case depends on it); OpenRouter's ``usage.cost`` read as the billed amount; error bodies recognised
whether they come with an error status or with HTTP 200; ``Retry-After`` passed to the retry loop.
Against a hostile or broken server: each attempt has one overall deadline (``timeout_s``, headers and
body together, however slowly they drip); a body above :func:`max_body_bytes` is refused unread; a
``usage`` whose counts or cost are not numbers >= 0 is a malformed response (booked in full, not
retried, not cached); no server-reported amount is ever a credit; the API key is scrubbed from every
text taken from a response (completion, tool calls, error message) before it leaves this module. The
server's ``finish_reason``, its own ``tool_calls`` and per-token ``logprobs`` are kept in the response
for the generation path (``teacher_replay.endpoint``).

A request's ``tools`` (the session's function-tool schemas) are sent as the ``tools`` field; the
answer's ``tool_calls`` come back as the server wrote them (keys scrubbed) for ``wire`` to read.

What is not covered: streaming, ``tool_choice`` (the server's default, ``auto``), reading live prices,
a key the server echoes in a transformed form (base64, split).
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import orjson

from composer_replication._extras import require
from composer_replication.config.base import check_base_url

from ..keys import KeyScrubber
from .base import BILLED_NOTHING, BILLED_UNKNOWN, ChatRequest, ChatResponse, TeacherError

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"
_SHARD = 2
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})


def _import_httpx():
    require("replay", "httpx", purpose="teacher replay over HTTP")
    import httpx

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


def max_body_bytes(max_tokens: int) -> int:
    """The largest response body read for a call with ``max_tokens``: 1 MiB plus 64 bytes per token.

    A real answer is a few bytes per token plus a little JSON; anything far larger (a 10 MB
    "completion" for ``max_tokens=256``) is not an answer to this request and is refused unread.
    """
    return (1 << 20) + 64 * max_tokens


def _number(v: Any) -> float | None:
    """``v`` if it is a finite JSON number >= 0 (bools are not numbers), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


def _tokens(usage: dict[str, Any], name: str, scrub: KeyScrubber) -> int | None:
    """A token count: a non-negative integer (or None if absent); anything else is malformed usage."""
    if name not in usage or usage[name] is None:
        return None
    v = _number(usage[name])
    if v is None or v != int(v) or v > 2**53:
        raise _malformed(f"usage.{name} is {_show(usage[name], scrub)} (expected an integer >= 0)")
    return int(v)


def _show(v: Any, scrub: KeyScrubber, limit: int = 80) -> str:
    """A server-supplied value for an error message: keys scrubbed first, then shortened."""
    text = scrub(repr(v))
    return text if len(text) <= limit else text[:limit] + "..."


def _malformed(what: str) -> TeacherError:
    # The call reached the server and may have been billed: book it in full, do not retry or cache it.
    return TeacherError(f"malformed response: {what}", retryable=False, billed=BILLED_UNKNOWN)


def _error_from_body(body: dict[str, Any], status: int, scrub: KeyScrubber) -> TeacherError:
    err = body.get("error")
    if not isinstance(err, dict):
        err = {"message": str(err)}
    code: Any = err.get("code")
    try:
        code = int(code)
    except (TypeError, ValueError, OverflowError):
        code = status
    meta = err.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    etype = meta.get("error_type", "")
    msg = (
        f"HTTP {status}"
        + (f" error {code}" if code != status else "")
        + f": {scrub(str(err.get('message', '')))[:300]}"
    )
    retryable = code in RETRYABLE_STATUS or etype in ("rate_limit_exceeded", "timeout")
    usage = body.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    billed, cost = BILLED_NOTHING, None
    if usage.get("cost") is not None:
        cost = _number(usage["cost"])
        if cost is None:  # negative, a string, ...: never a credit; the charge is unknown
            billed = BILLED_UNKNOWN
            msg += f" (with a malformed usage.cost {_show(usage['cost'], scrub)})"
    return TeacherError(msg, retryable=retryable, billed=billed, cost_usd=cost, fatal=code == 402)


def parse_response(status: int, headers: Any, raw: bytes, scrub: KeyScrubber = KeyScrubber()) -> ChatResponse:
    """A chat-completions HTTP response as a ``ChatResponse``, or the ``TeacherError`` it amounts to.

    Every text taken from the body passes through ``scrub`` (the known API keys) before it is
    returned or put in an error message.
    """
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if status != 200:
        if isinstance(body, dict) and "error" in body:
            err = _error_from_body(body, status, scrub)
        else:
            text = scrub(raw.decode("utf-8", "replace"))
            err = TeacherError(
                f"HTTP {status}: {text[:200]!r}", retryable=status in RETRYABLE_STATUS, fatal=status == 402
            )
        err.retry_after_s = _retry_after(headers)
        raise err
    if not isinstance(body, dict):
        # A 200 we cannot read may still have been generated and billed.
        raise TeacherError("HTTP 200 with a body that is not JSON", retryable=True, billed=BILLED_UNKNOWN)
    if "error" in body and body["error"]:
        raise _error_from_body(body, 200, scrub)
    try:
        choice = body["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls") or None
        text = message["content"] if calls is None or message.get("content") is not None else ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise TeacherError(
            "HTTP 200 without choices[0].message.content", retryable=True, billed=BILLED_UNKNOWN
        ) from None
    if isinstance(choice, dict) and choice.get("finish_reason") == "error":
        raise TeacherError("provider error (finish_reason=error)", retryable=True, billed=BILLED_UNKNOWN)
    usage = body.get("usage")
    if not isinstance(usage, dict):
        raise _malformed("HTTP 200 without a usage object")
    pt, ct = _tokens(usage, "prompt_tokens", scrub), _tokens(usage, "completion_tokens", scrub)
    cost = None
    if usage.get("cost") is not None:
        cost = _number(usage["cost"])
        if cost is None:
            raise _malformed(f"usage.cost is {_show(usage['cost'], scrub)} (expected a number >= 0)")
    elif pt is None or ct is None:
        raise _malformed("usage has neither cost nor both token counts")
    return ChatResponse(
        text=scrub(text if isinstance(text, str) else json.dumps(text)),
        prompt_tokens=pt or 0,
        completion_tokens=ct or 0,
        cost_usd=cost,
        finish_reason=choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None,
        tool_calls=_scrubbed(calls, scrub) if isinstance(calls, list) else None,
        logprobs=_logprobs(choice.get("logprobs")),
    )


def _scrubbed(value: Any, scrub: KeyScrubber) -> Any:
    """``value`` (parsed JSON) with the known keys scrubbed from every string in it."""
    return orjson.loads(scrub(orjson.dumps(value).decode()))


def _logprobs(block: Any) -> list[float] | None:
    """``choices[0].logprobs.content[*].logprob`` when every entry is a finite number <= 0, else None."""
    content = block.get("content") if isinstance(block, dict) else None
    if not isinstance(content, list):
        return None
    out: list[float] = []
    for e in content:
        v = e.get("logprob") if isinstance(e, dict) else None
        mag = _number(-v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        if mag is None:
            return None
        out.append(-mag)
    return out


class OpenAICompatBackend:
    def __init__(self, spec: dict[str, Any], *, api_key: str | None, concurrency: int) -> None:
        httpx = _import_httpx()
        self._httpx = httpx
        self.base_url = check_base_url(
            spec.get("base_url", OPENROUTER_BASE_URL), f"teacher {spec.get('slug')!r}: base_url"
        )
        self.is_openrouter = self.base_url.startswith(OPENROUTER_BASE_URL)
        self._url = httpx.URL(f"{self.base_url}/chat/completions")  # parsed once, not per request
        self._scrub = KeyScrubber([api_key])
        # identity: a body we read is bounded by bytes on the wire, never by a decompressor's output
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
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
        if req.tools:
            body["tools"] = req.tools
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

    async def _exchange(self, client: Any, req: ChatRequest, limit: int) -> tuple[int, Any, bytes]:
        """POST and read the whole body, refusing one longer than ``limit`` bytes."""
        request = client.build_request(
            "POST", self._url, content=orjson.dumps(self._body(req)), timeout=self._timeout(req.timeout_s)
        )
        resp = await client.send(request, stream=True)
        try:
            if resp.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
                raise _malformed(
                    f"Content-Encoding {resp.headers['content-encoding']!r} though identity was asked"
                )
            declared = resp.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise _too_large(int(declared), limit, req.max_tokens)
            chunks, n = [], 0
            async for chunk in resp.aiter_raw():
                n += len(chunk)
                if n > limit:
                    raise _too_large(n, limit, req.max_tokens)
                chunks.append(chunk)
        finally:
            await resp.aclose()
        return resp.status_code, resp.headers, b"".join(chunks)

    async def complete(self, req: ChatRequest) -> ChatResponse:
        httpx = self._httpx
        shard = min(range(len(self._clients)), key=self._busy.__getitem__)
        self._busy[shard] += 1
        try:
            # One deadline for the whole attempt: httpx's timeouts are per read, so a server that
            # drip-feeds a byte at a time would otherwise keep a request alive indefinitely.
            async with asyncio.timeout(req.timeout_s):
                status, headers, raw = await self._exchange(
                    self._clients[shard], req, max_body_bytes(req.max_tokens)
                )
        except (TimeoutError, httpx.TimeoutException):
            raise TeacherError(
                f"timeout: no complete answer within {req.timeout_s}s", retryable=True, billed=BILLED_UNKNOWN
            ) from None
        except httpx.ConnectError as exc:
            raise TeacherError(
                f"connect error: {self._scrub(str(exc))}", retryable=True, billed=BILLED_NOTHING
            ) from None
        except httpx.TransportError as exc:
            raise TeacherError(
                f"transport error: {type(exc).__name__}", retryable=True, billed=BILLED_UNKNOWN
            ) from None
        finally:
            self._busy[shard] -= 1
        return parse_response(status, headers, raw, self._scrub)

    async def aclose(self) -> None:
        for c in self._clients:
            await c.aclose()


def _too_large(n: int, limit: int, max_tokens: int) -> TeacherError:
    return _malformed(f"response body above {limit} bytes ({n}+ bytes for max_tokens={max_tokens})")
