"""A loopback server speaking the OpenRouter chat-completions subset, for tests, demos and benchmarks.

It answers ``POST /v1/chat/completions`` like OpenRouter: ``usage`` with ``cost``, error bodies
``{"error": {"code", "message", "metadata"}}``, 429 with ``Retry-After``, 5xx, error bodies with
status 200, unreadable bodies, slow answers. Each request is scripted by ``script(info) -> Reply``;
requests are counted per key ``(model, last user message)`` so tests can prove nothing is re-sent.
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


@dataclass
class Reply:
    """What to answer. ``kind``: ok | http_error | error_200 | malformed | hang."""

    kind: str = "ok"
    status: int = 200
    text: str | None = None  # ok: the content (default: the responder's)
    retry_after: str | None = None
    delay_s: float = 0.0  # on top of the server's latency
    cost: float | None | str = "auto"  # ok: "auto" = tokens x price; None = omit usage.cost
    completion_tokens: int | None = None


@dataclass
class RequestInfo:
    model: str
    key: tuple[str, str]
    n: int  # 1-based count of requests with this key, including this one
    body: dict[str, Any]
    authorization: str | None


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

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(_serve(self, port, ready, self._box))
            except BaseException as e:  # noqa: BLE001 - reported to start()
                errors.append(e)
                ready.set()
            finally:
                self._loop.close()

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

    # -- behaviour -------------------------------------------------------------------------------
    def handle(self, body: dict[str, Any], auth: str | None) -> tuple[int, dict[str, str], bytes, float]:
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
            return (*_err(401, "missing or wrong API key"), self.latency_s)
        info = RequestInfo(model=key[0], key=key, n=n, body=body, authorization=auth)
        reply = self.script(info) if self.script else Reply()
        delay = self.latency_s + reply.delay_s
        if reply.kind == "hang":
            return 200, {}, b"{}", delay + 3600.0
        if reply.kind == "malformed":
            return 200, {}, b'{"id": "gen-1", "choices": [{"message": {"content": "trunc', delay
        if reply.kind == "http_error":
            status, headers, payload = _err(reply.status, f"scripted {reply.status}")
            if reply.retry_after is not None:
                headers["Retry-After"] = reply.retry_after
            return status, headers, payload, delay
        if reply.kind == "error_200":
            _, headers, payload = _err(
                reply.status if reply.status != 200 else 502, "provider returned error"
            )
            return 200, headers, payload, delay
        text = reply.text if reply.text is not None else self.responder(key[0], messages)
        max_tokens = int(body.get("max_tokens") or 1 << 30)
        pt = sum(math.ceil(len(str(m.get("content", "")).encode()) / 4) + 4 for m in messages)
        ct = reply.completion_tokens if reply.completion_tokens is not None else len(text.encode()) // 4 + 1
        ct = min(ct, max_tokens)
        usage: dict[str, Any] = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
        pin, pout = self.prices.get(key[0], (0.0, 0.0))
        cost = (pt * pin + ct * pout) / 1e6 if reply.cost == "auto" else reply.cost
        if cost is not None:
            usage["cost"] = cost
            with self._lock:
                self.billed_usd += float(cost)
        payload = {
            "id": f"gen-{self.n_requests}",
            "model": key[0],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": usage,
        }
        return 200, {}, json.dumps(payload).encode(), delay


def _err(status: int, message: str) -> tuple[int, dict[str, str], bytes]:
    etype = {429: "rate_limit_exceeded", 402: "insufficient_credits", 400: "invalid_request"}.get(
        status, "provider_error"
    )
    body = {"error": {"code": status, "message": message, "metadata": {"error_type": etype}}}
    return status, {}, json.dumps(body).encode()


def _aiohttp_web() -> Any:
    try:
        from aiohttp import web
    except ImportError as e:  # pragma: no cover - aiohttp comes with the replay extra
        raise ImportError(
            "the loopback OpenRouter server needs aiohttp: pip install 'composer-replication[replay]'"
        ) from e
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
            status, headers, payload, delay = *_err(400, "request body is not JSON"), 0.0
        else:
            status, headers, payload, delay = app.handle(body, request.headers.get("Authorization"))
        if delay > 0:
            await asyncio.sleep(max(0.0, arrived + delay - loop.time()))
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
