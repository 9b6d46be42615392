"""A loopback server speaking the OpenRouter chat-completions subset, for tests, demos and benchmarks.

It answers ``POST /v1/chat/completions`` like OpenRouter: ``usage`` with ``cost``, error bodies
``{"error": {"code", "message", "metadata"}}``, 429 with ``Retry-After``, 5xx, error bodies with
status 200, unreadable bodies, slow answers. Each request is scripted by ``script(info) -> Reply``;
requests are counted per key ``(model, last user message)`` so tests can prove nothing is re-sent.

Hostile behaviours, for the adversarial tests: any ``cost`` (negative, a string) in 200 and error
bodies (``Reply.cost``); ``usage`` fields replaced by anything (``Reply.usage``); the request's
``Authorization`` header and body echoed into the error message or the completion (``Reply.echo``);
the response written one byte every ``Reply.drip_s`` seconds, headers included or body only
(``Reply.drip``); a completion of ``Reply.huge_bytes`` bytes streamed chunked, with no
``Content-Length`` to refuse it by.

Tool calling: a request's ``tools`` are kept in ``RequestInfo.body``; ``Reply.tool_calls`` answers with
OpenAI ``tool_calls`` entries sent exactly as given (:func:`tool_call` builds one; hostile ones are any
JSON: arguments that are not JSON, empty names, thousands of calls), ``finish_reason: "tool_calls"``
and ``content`` null unless ``Reply.text`` is set. ``FakeOpenRouter(tools_supported=False)`` plays an
endpoint without tool support: a request with ``tools`` gets HTTP 400, as vLLM without a tool parser
and Ollama answer.

Binds 127.0.0.1 only. Run standalone: ``python -m composer_replication.teacher_replay.fake_server``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from composer_replication._extras import require


@dataclass
class Reply:
    """What to answer. ``kind``: ok | http_error | error_200 | text_error (a non-JSON error page) | malformed | hang."""

    kind: str = "ok"
    status: int = 200
    text: str | None = None  # ok: the content (default: the responder's)
    retry_after: str | None = None
    delay_s: float = 0.0  # on top of the server's latency
    cost: Any = "auto"  # ok: "auto" = tokens x price; None = omit usage.cost; errors: put in usage.cost
    completion_tokens: int | None = None
    usage: dict[str, Any] | None = None  # ok: merged over the computed usage (e.g. prompt_tokens="lots")
    echo: bool = False  # put the Authorization header and the request body in the message / completion
    drip_s: float = 0.0  # > 0: write the response one byte at a time, this many seconds apart
    drip: str = "all"  # "all": status line and headers dripped too; "body": headers at once, then the body
    huge_bytes: int = 0  # ok: a completion of this many bytes, sent chunked without Content-Length
    tool_calls: list[Any] | None = None  # ok: message.tool_calls, sent as given (content null unless text)


def tool_call(name: Any, arguments: Any, call_id: str = "call_0") -> dict[str, Any]:
    """One OpenAI ``tool_calls`` entry; ``arguments`` a dict is sent as JSON text, anything else as is."""
    args = json.dumps(arguments) if isinstance(arguments, dict) else arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


@dataclass
class RequestInfo:
    model: str
    key: tuple[str, str]
    n: int  # 1-based count of requests with this key, including this one
    body: dict[str, Any]
    authorization: str | None


def sample_states(n: int, prefix: str = "s") -> list[dict[str, Any]]:
    """``n`` small ``TraceState`` dicts (for tests and demos against this server)."""
    from composer_replication.wire import format_tool_use

    student = format_tool_use("Bash", {"command": "ls"})
    return [
        {"state_id": f"{prefix}{i}", "student_action": student,
         "messages": [{"role": "system", "content": "You are a coding agent."},
                      {"role": "user", "content": f"task {prefix}{i}: fix the failing test"}]}
        for i in range(n)
    ]  # fmt: skip


def _default_responder(model: str, messages: list[dict[str, Any]]) -> str:
    from composer_replication.wire import format_tool_use

    return format_tool_use("Read", {"file_path": "README.md"})


@dataclass
class FakeOpenRouter:
    latency_s: float = 0.0
    prices: dict[str, tuple[float, float]] = field(default_factory=dict)  # model -> ($/Mtok in, out)
    script: Callable[[RequestInfo], Reply] | None = None
    responder: Callable[[str, list[dict[str, Any]]], str] = _default_responder
    required_key: str | None = None
    tools_supported: bool = True  # False: a request with ``tools`` is refused with HTTP 400
    counts: Counter = field(default_factory=Counter)
    n_requests: int = 0
    billed_usd: float = 0.0
    seen_auth: set = field(default_factory=set)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._box: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, port: int = 0) -> FakeOpenRouter:
        """Serve on 127.0.0.1 from an event loop in a daemon thread; returns once the port is bound."""
        _aiohttp_web()  # fail here, in the caller, if the extra is missing
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        errors: list[BaseException] = []

        loop = self._loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(_serve(self, port, ready, self._box))
            except BaseException as e:  # noqa: BLE001 - reported to start()
                errors.append(e)
                ready.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name="fake-openrouter")
        self._thread.start()
        ready.wait()
        if errors:
            raise RuntimeError(f"fake OpenRouter server could not start on port {port}: {errors[0]}")
        return self

    @property
    def base_url(self) -> str:
        assert "port" in self._box, "call start() first"
        return f"http://127.0.0.1:{self._box['port']}/v1"

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._box["stop"].set)
            self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> FakeOpenRouter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def teachers(
        self, slugs: tuple[str, ...] = ("t/a",), price: tuple[float, float] = (1.0, 4.0), **extra: Any
    ) -> list[dict[str, Any]]:
        """``TeacherSpec`` dicts pointing at this server, billed here at ``price`` ($/Mtok in, out)."""
        for s in slugs:
            self.prices[s] = price
        return [{"slug": s, "input_per_mtok": price[0], "output_per_mtok": price[1], "base_url": self.base_url, **extra}
                for s in slugs]  # fmt: skip

    # -- behaviour -------------------------------------------------------------------------------
    def handle(self, body: dict[str, Any], auth: str | None) -> tuple[int, dict[str, str], bytes, float]:
        """(status, headers, body bytes, delay s) of the answer to one request."""
        return self._respond(body, auth)[:4]

    def _respond(
        self, body: dict[str, Any], auth: str | None
    ) -> tuple[int, dict[str, str], bytes, float, Reply]:
        messages = body.get("messages") or []
        last_user = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
        key = (str(body.get("model")), str(last_user))
        with self._lock:
            self.counts[key] += 1
            self.n_requests += 1
            n = self.counts[key]
            if auth:
                self.seen_auth.add(auth)
        if self.required_key is not None and auth != f"Bearer {self.required_key}":
            return (*_err(401, "missing or wrong API key"), self.latency_s, Reply())
        if body.get("tools") and not self.tools_supported:
            msg = f"model {key[0]} does not support tools"
            return (*_err(400, msg), self.latency_s, Reply())
        info = RequestInfo(model=key[0], key=key, n=n, body=body, authorization=auth)
        reply = self.script(info) if self.script else Reply()
        delay = self.latency_s + reply.delay_s
        if reply.kind == "hang":
            return 200, {}, b"{}", delay + 3600.0, reply
        if reply.kind == "malformed":
            return 200, {}, b'{"id": "gen-1", "choices": [{"message": {"content": "trunc', delay, reply
        echo = f" (request: {auth} {json.dumps(body)})" if reply.echo else ""
        if reply.kind == "text_error":
            return reply.status, {}, f"<html>{reply.status} scripted{echo}</html>".encode(), delay, reply
        if reply.kind in ("http_error", "error_200"):
            code = reply.status if reply.kind == "http_error" or reply.status != 200 else 502
            msg = (f"scripted {code}" if reply.kind == "http_error" else "provider returned error") + echo
            cost = None if reply.cost == "auto" else reply.cost
            _, headers, payload = _err(code, msg, cost=cost, with_cost=reply.cost != "auto")
            if reply.retry_after is not None:
                headers["Retry-After"] = reply.retry_after
            return (code if reply.kind == "http_error" else 200), headers, payload, delay, reply
        calls = reply.tool_calls
        default = "" if calls is not None else self.responder(key[0], messages)
        text = (reply.text if reply.text is not None else default) + "a" * reply.huge_bytes + echo
        max_tokens = int(body.get("max_tokens") or 1 << 30)
        pt = sum(math.ceil(len(str(m.get("content", "")).encode()) / 4) + 4 for m in messages)
        n_out = len(text.encode()) + (len(json.dumps(calls)) if calls is not None else 0)
        ct = reply.completion_tokens if reply.completion_tokens is not None else n_out // 4 + 1
        ct = min(ct, max_tokens)
        usage: dict[str, Any] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
        pin, pout = self.prices.get(key[0], (0.0, 0.0))
        cost = (pt * pin + ct * pout) / 1e6 if reply.cost == "auto" else reply.cost
        if cost is not None:
            usage["cost"] = cost
            if isinstance(cost, (int, float)) and not isinstance(cost, bool):
                with self._lock:
                    self.billed_usd += float(cost)
        usage.update(reply.usage or {})
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls is not None:
            message = {"role": "assistant", "content": text or None, "tool_calls": calls}
        body_out = {
            "id": f"gen-{self.n_requests}",
            "model": key[0],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": usage,
        }
        return 200, {}, json.dumps(body_out).encode(), delay, reply


def _err(
    status: int, message: str, *, cost: Any = None, with_cost: bool = False
) -> tuple[int, dict[str, str], bytes]:
    etype = {429: "rate_limit_exceeded", 402: "insufficient_credits", 400: "invalid_request"}.get(
        status, "provider_error"
    )
    body: dict[str, Any] = {"error": {"code": status, "message": message, "metadata": {"error_type": etype}}}
    if with_cost:
        body["usage"] = {"cost": cost}
    return status, {}, json.dumps(body).encode()


def _aiohttp_web() -> Any:
    require("replay", "aiohttp", purpose="the loopback OpenRouter server")
    from aiohttp import web

    return web


async def _serve(app: FakeOpenRouter, port: int, ready: threading.Event, box: dict[str, Any]) -> None:
    web = _aiohttp_web()

    loop = asyncio.get_running_loop()

    async def on_post(request: Any) -> Any:
        arrived = loop.time()  # the latency runs from the request's arrival, like a real server's
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            status, headers, payload, delay, reply = *_err(400, "request body is not JSON"), 0.0, Reply()
        else:
            status, headers, payload, delay, reply = app._respond(body, request.headers.get("Authorization"))
        if delay > 0:
            await asyncio.sleep(max(0.0, arrived + delay - loop.time()))
        if reply.drip_s > 0:
            return await _drip(request, status, headers, payload, reply)
        if reply.huge_bytes:
            resp = web.StreamResponse(status=status, headers={**headers, "Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(0, len(payload), 1 << 16):
                await resp.write(payload[i : i + (1 << 16)])
            await resp.write_eof()
            return resp
        return web.Response(status=status, body=payload, headers=headers, content_type="application/json")

    web_app = web.Application(client_max_size=64 << 20)
    web_app.router.add_post("/{tail:.*}", on_post)
    # handler_cancellation: a client that gives up (timeout) cancels its scripted 'hang' at once
    runner = web.AppRunner(web_app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024, shutdown_timeout=0.5)
    await site.start()
    box["port"] = runner.addresses[0][1]
    box["stop"] = asyncio.Event()
    ready.set()
    try:
        await box["stop"].wait()
    finally:
        await runner.cleanup()


async def _drip(request: Any, status: int, headers: dict[str, str], payload: bytes, reply: Reply) -> Any:
    """Write the raw HTTP response a byte at a time (a slowloris in reverse), then close the connection."""
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "Connection: close\r\n\r\n"
    transport = request.transport
    if reply.drip == "body":
        transport.write(head.encode())
        data = payload
    else:
        data = head.encode() + payload
    for i in range(len(data)):
        if transport.is_closing():
            break
        transport.write(data[i : i + 1])
        await asyncio.sleep(reply.drip_s)
    transport.close()
    raise asyncio.CancelledError  # the response was written by hand; aiohttp must not write another


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0)
    args = ap.parse_args()
    srv = FakeOpenRouter(latency_s=args.latency).start(args.port)
    print(srv.base_url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    main()
