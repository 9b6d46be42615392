"""One replay run as an object with small named steps: what `client.replay_states` drives.

A `ReplayRun` holds what a run shares (the planned calls, the result cache, the spend ledger, one
backend per teacher, the slots of ``concurrency``, each teacher's cool-down, the stop) and takes each
call through its steps:

    replay      attempts until an answer, a final error, or a reason not to send; backs off between
    attempt     cool-down -> a slot -> may we send? -> reserve -> send
    send        one request; its outcome settled in the ledger (answer, failure, stop, interruption)
    record      the row appended to the cache (answers and final errors; "not sent" rows are not)

and `report` sums it up. Its guarantees are `client`'s (spend cap, resume, retries, keys, stop).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from composer_replication.safety.kill_switch import KillSwitchTriggered
from composer_replication.safety.stop import Stop

from .actions import answer_text, teacher_vote
from .backends.base import BILLED_UNKNOWN, TeacherError
from .backends.factory import make_backend
from .backends.openai_compat import OPENROUTER_BASE_URL
from .cache import ResultCache
from .keys import DEFAULT_KEY_ENV, KeyScrubber, resolve_api_key
from .ledger import Reservation, SpendLedger
from .plan import _Call
from .prompt import cost_from_tokens
from .types import TeacherCallResult
from .waits import Stopped, StopWatch

log = logging.getLogger(__name__)
# An endpoint refusing the ``tools`` field (vLLM without a tool parser, Ollama and OpenRouter for a model
# without tool support): the teacher is asked in the text format instead.
_REFUSES_TOOLS = re.compile(
    r"^HTTP (400|404|422)\b.*(support\w*\s+(for\s+)?tool|tools?\s+(is\s+|are\s+)?not\s+supported"
    r"|enable-auto-tool-choice|tool.choice|tools\s+param)",
    re.IGNORECASE | re.DOTALL,
)


@dataclass
class RetryPolicy:
    max_attempts: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 30.0  # a longer Retry-After (a hostile or confused server) waits this long

    def delay(self, attempt: int, retry_after_s: float | None) -> float:
        # Full jitter (AWS architecture blog): spreads retries of a burst of 429s apart.
        d = random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2**attempt))
        if retry_after_s is not None:
            d = max(d, min(retry_after_s, self.retry_after_max_s))
        return d


@dataclass
class ReplayReport:
    """What a run did, for the CLI and the pipeline manifest."""

    results: list[TeacherCallResult]
    n_cached: int = 0
    n_sent: int = 0
    n_errors: int = 0
    n_http_requests: int = 0
    spent_usd: float = 0.0  # booked by this run
    prior_usd: float = 0.0  # booked by earlier runs (and other processes) sharing the ledger file
    stopped: str | None = None
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    max_total_usd: float = 0.0
    overrun: bool = False  # the ledger books more than the cap: a provider billed above its reservation
    tool_modes: dict[str, str] = field(default_factory=dict)  # teacher -> "native" (tools) or "text"
    malformed_by_teacher: dict[str, int] = field(default_factory=dict)  # answers that cannot vote

    @property
    def total_usd(self) -> float:
        return self.prior_usd + self.spent_usd


@dataclass
class _Failed:
    """An attempt that ended in a `TeacherError` (settled already): retried or given up by `replay`."""

    error: TeacherError
    latency_s: float


def _needs_key(spec: dict[str, Any]) -> bool:
    return spec.get("backend", "openai") == "openai" and spec.get("base_url", OPENROUTER_BASE_URL).startswith(
        OPENROUTER_BASE_URL
    )


def known_keys(teachers: Sequence[dict[str, Any]], api_key: str | None) -> KeyScrubber:
    """Every key this process could send: the argument and each teacher's key variable (env, ./.env)."""
    envs = {DEFAULT_KEY_ENV} | {t["api_key_env"] for t in teachers if t.get("api_key_env")}
    return KeyScrubber([api_key, *(resolve_api_key(None, e) for e in sorted(envs))])


def _booked(usd: float, reserved: float) -> float:
    """What a settle books for a reported amount: never below zero; not a number means unknown (in full)."""
    if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not math.isfinite(usd):
        return reserved
    return max(0.0, float(usd))


def _row(call: _Call, **kw: Any) -> TeacherCallResult:
    row: TeacherCallResult = {
        "state_id": call.state["state_id"], "teacher_slug": call.spec["slug"], "response_text": None,
        "latency_s": 0.0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, "error": None,
    }  # fmt: skip
    row.update(kw)  # type: ignore[typeddict-item]
    return row


def _not_sent(call: _Call, why: str) -> TeacherCallResult:
    return _row(call, error=f"not sent: {why}")


class ReplayRun:
    """The calls of one `replay_states` call, their shared state and their steps (module docstring)."""

    def __init__(
        self, calls: list[_Call], *, cache: ResultCache, ledger: SpendLedger, scrub: KeyScrubber,
        retry: RetryPolicy, stop: Stop, concurrency: int,
    ) -> None:  # fmt: skip
        self.calls, self.cache, self.ledger, self.scrub, self.retry = calls, cache, ledger, scrub, retry
        self.concurrency = concurrency
        self.watch = StopWatch(stop, lambda: ledger.spent_usd)
        self.results: dict[str, TeacherCallResult] = {}
        self.todo: list[_Call] = []
        self.text_teachers: set[str] = set()  # teachers whose endpoint refused tools: asked in text
        for c in calls:
            hit = cache.get(c.key)
            if hit is None and c.twin is not None and c.twin.key in cache.fell_back:
                hit = cache.get(c.twin.key)  # its endpoint refused tools in an earlier run
                self.text_teachers.add(c.spec["slug"])
            if hit is None:
                self.todo.append(c)
            else:
                self.results[c.key] = hit
        self.n_cached, self.n_sent, self.n_http_requests = len(self.results), 0, 0
        self.fatal: str | None = None  # a reason to send nothing more (HTTP 402)
        self.cooldown: dict[str, float] = {}  # teacher slug -> monotonic time before which nothing is sent
        self._backends: dict[tuple, Any] = {}  # shared by the teachers with the same server and key
        self._backend_of: dict[str, Any] = {}  # teacher slug -> its backend
        self._bar: Any = None

    # ----------------------------------------------------------------------------- setup, teardown
    def open_backends(self, api_key: str | None) -> None:
        """One backend per teacher with calls to send; RuntimeError if one needs a key and none is found."""
        for c in self.todo:
            slug = c.spec["slug"]
            if slug not in self._backend_of:
                self._backend_of[slug] = self._backend_for(c.spec, api_key)

    def _backend_for(self, spec: dict[str, Any], api_key: str | None) -> Any:
        env = spec.get("api_key_env", DEFAULT_KEY_ENV)
        key = (
            resolve_api_key(api_key, env) if (_needs_key(spec) or api_key or "api_key_env" in spec) else None
        )
        if _needs_key(spec) and not key:
            raise RuntimeError(
                f"teacher {spec['slug']!r} needs an API key: pass api_key=..., set ${env}, or put {env}=... in ./.env"
            )
        ident = (spec.get("backend", "openai"), spec.get("base_url"), spec.get("model_path"), key)
        if ident not in self._backends:
            self._backends[ident] = make_backend(spec, api_key=key, concurrency=self.concurrency)
        return self._backends[ident]

    async def aclose(self) -> None:
        for b in self._backends.values():
            await b.aclose()
        self.cache.close()
        self.ledger.close()

    # ----------------------------------------------------------------------------- the run
    async def run(self, *, progress: bool) -> None:
        """Every call not in the cache, ``concurrency`` at a time, until each has a row."""
        self.slots = asyncio.Semaphore(self.concurrency)
        if progress and self.todo:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=len(self.todo), unit="call", desc="replay", dynamic_ncols=True)
        self.watch.start()
        try:
            await asyncio.gather(*(self._track(c) for c in self.todo))
        finally:
            await self.watch.close()
            if self._bar is not None:
                self._bar.close()
        self.ledger.refresh()  # what other processes sharing the file booked meanwhile, for the totals

    async def _track(self, call: _Call) -> None:
        row = await self.replay(call)
        self.results[call.key] = row
        self.n_sent += row["error"] is None or not str(row["error"]).startswith("not sent")
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(
                f"spent ${self.ledger.spent_usd:.4f} of ${self.ledger.max_total_usd:.2f}", refresh=False
            )

    async def replay(self, call: _Call) -> TeacherCallResult:
        """One call to its end: attempts until an answer, a final error or a reason not to send. A
        teacher whose endpoint refuses ``tools`` is asked in the text format (``call.twin``) from then on."""
        attempts = 0
        while True:
            if call.twin is not None and call.spec["slug"] in self.text_teachers:
                call, attempts = call.twin, 0
                hit = self.cache.get(call.key)
                if hit is not None:
                    return hit
            outcome = await self.attempt(call)
            if outcome is None:  # a cool-down began while it queued: not an attempt
                continue
            if not isinstance(outcome, _Failed):
                return outcome
            attempts += 1
            err = outcome.error
            if call.twin is not None and not err.retryable and _REFUSES_TOOLS.match(str(err)):
                self._fall_back(call, err)
                continue
            if not err.retryable or err.fatal or attempts >= self.retry.max_attempts:
                error = f"{self.scrub(str(err))} (after {attempts} attempt(s))"
                return await self.record(call, _row(call, latency_s=round(outcome.latency_s, 4), error=error))
            try:
                await self.watch.sleep(self.retry.delay(attempts - 1, err.retry_after_s))
            except Stopped as stop:
                return _not_sent(call, f"stopped: {stop.reason}")

    def _fall_back(self, call: _Call, err: TeacherError) -> None:
        slug = call.spec["slug"]
        if slug not in self.text_teachers:
            self.text_teachers.add(slug)
            log.warning("teacher %r: the endpoint refused tools (%s); asking it in the text format from now on",
                        slug, self.scrub(str(err))[:200])  # fmt: skip

    async def attempt(self, call: _Call) -> TeacherCallResult | _Failed | None:
        """Wait out the teacher's cool-down, take a slot, check that we may send, reserve, send.

        None: a ``Retry-After`` from another call arrived while this one queued (try again)."""
        slug = call.spec["slug"]
        try:
            await self.cool_down(slug)
        except Stopped as stop:
            return _not_sent(call, f"stopped: {stop.reason}")
        async with self.slots:
            if self.cooldown.get(slug, 0.0) > time.monotonic():
                return None  # release the slot and wait it out
            if self.watch.poll():
                return _not_sent(call, f"stopped: {self.watch.reason}")
            if self.fatal:
                return _not_sent(call, self.fatal)
            res = await self.ledger.reserve(call.key, call.reserve_usd)
            if res is None:
                return _not_sent(call, self._refusal(call))
            return await self.send(call, res)

    async def cool_down(self, slug: str) -> None:
        """Wait until the teacher's ``Retry-After`` has passed (`Stopped` ends it)."""
        await self.watch.sleep(self.cooldown.get(slug, 0.0) - time.monotonic())

    def _refusal(self, call: _Call) -> str:
        ledger = self.ledger
        why = "provider overcharged; run halted" if ledger.overrun else "budget exhausted"
        return (
            f"{why} (${ledger.committed_usd:.6f} of ${ledger.max_total_usd:.6f} booked; "
            f"this call's worst case is ${call.reserve_usd:.6f})"
        )

    async def send(self, call: _Call, res: Reservation) -> TeacherCallResult | _Failed:
        """One request under its reservation; its outcome settled in the ledger before anything else."""
        t0 = time.perf_counter()
        self.n_http_requests += 1
        try:
            resp = await self.watch.wait(self._backend_of[call.spec["slug"]].complete(call.request))
        except Stopped as stop:  # abandoned in flight: it may have been billed
            await self.ledger.settle(res, res.usd, note="stopped in flight: outcome unknown")
            error = f"stopped in flight: {stop.reason} (booked in full: it may have been billed)"
            return _row(call, latency_s=round(time.perf_counter() - t0, 4), error=error)
        except TeacherError as exc:
            latency = time.perf_counter() - t0
            await self.settle_failure(call, res, exc)
            return _Failed(exc, latency)
        except BaseException:
            await self.ledger.settle(res, res.usd, note="interrupted")
            raise
        latency = time.perf_counter() - t0
        cost = resp.cost_usd
        if cost is None:
            cost = cost_from_tokens(resp.prompt_tokens, resp.completion_tokens, call.spec)
        cost = _booked(cost, res.usd)
        await self.ledger.settle(res, cost)
        text = self.scrub(answer_text(resp.text, resp.tool_calls))
        problem = teacher_vote(text, call.tool_names)[1]
        if problem is not None:
            log.warning("teacher %r, state %r: malformed answer, booked and not counted as a vote: %s",
                        call.spec["slug"], call.state["state_id"], self.scrub(problem))  # fmt: skip
        row = _row(
            call, response_text=text, latency_s=round(latency, 4), prompt_tokens=resp.prompt_tokens,
            completion_tokens=resp.completion_tokens, cost_usd=cost,
        )  # fmt: skip
        return await self.record(call, row)

    async def settle_failure(self, call: _Call, res: Reservation, exc: TeacherError) -> None:
        """Book a failed request (its reported cost, in full when unknown, or nothing), then heed it:
        a fatal error halts the run, a ``Retry-After`` starts the teacher's cool-down."""
        if exc.cost_usd is not None:
            await self.ledger.settle(res, _booked(exc.cost_usd, res.usd), note="error")
        elif exc.billed == BILLED_UNKNOWN:
            await self.ledger.settle(res, res.usd, note=f"outcome unknown: {self.scrub(str(exc))[:300]}")
        else:
            await self.ledger.release(res)
        if exc.fatal:
            self.fatal = f"run halted by {exc}"
        if exc.retry_after_s:
            slug = call.spec["slug"]  # a Retry-After pauses every call to that teacher, not just this one
            until = time.monotonic() + min(exc.retry_after_s, self.retry.retry_after_max_s)
            self.cooldown[slug] = max(self.cooldown.get(slug, 0.0), until)

    async def record(self, call: _Call, row: TeacherCallResult) -> TeacherCallResult:
        """Append the row to the cache (durably with ``fsync``); answers and final errors only."""
        extra: dict[str, Any] = {"tool_mode": call.tool_mode}
        if call.tool_mode != call.spec.get("tool_mode", "native"):
            extra["fell_back"] = True  # asked in text because its endpoint refused tools
        self.cache.put(call.key, call.phash, row, extra)
        await self.cache.sync()
        return row

    # ----------------------------------------------------------------------------- the report
    def report(self) -> ReplayReport:
        """Every call's row in plan order, with the counts and the spend; `KillSwitchTriggered` if stopped."""
        ledger = self.ledger
        rep = ReplayReport(
            results=[self.results[c.key] for c in self.calls], n_cached=self.n_cached, n_sent=self.n_sent,
            n_http_requests=self.n_http_requests, spent_usd=ledger.settled_usd, prior_usd=ledger.prior_usd,
            max_total_usd=ledger.max_total_usd, overrun=ledger.over_cap, stopped=self.watch.reason,
        )  # fmt: skip
        for c in self.calls:
            slug = c.spec["slug"]
            rep.tool_modes[slug] = "text" if slug in self.text_teachers else c.tool_mode
            r = self.results[c.key]
            if r["error"] is None and teacher_vote(r["response_text"], c.tool_names)[0] is None:
                rep.malformed_by_teacher[slug] = rep.malformed_by_teacher.get(slug, 0) + 1
        for r in rep.results:
            if r["error"] is not None:
                rep.n_errors += 1
                kind = str(r["error"]).split(":")[0][:40]
                rep.errors_by_kind[kind] = rep.errors_by_kind.get(kind, 0) + 1
        if rep.stopped:
            raise KillSwitchTriggered(rep.stopped)
        return rep
