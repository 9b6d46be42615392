"""Fan states out to teachers under a hard dollar cap, with retries, a cache and a kill switch.

What is covered: each (state, teacher) call is sent at most once per successful result across runs
(results append to a JSONL cache; a rerun sends only what is missing); the ledger reserves each
call's worst case before sending, so the recorded spend never exceeds ``max_total_usd`` while
providers bill at most the spec's prices, even with other processes sharing the ledger file (see
``ledger.py``); no settle path books an amount below zero; 408/429/5xx, timeouts (one overall
deadline per attempt) and unreadable bodies are retried with exponential backoff and full jitter,
honouring ``Retry-After``; a call that still fails becomes a result row with ``error`` set; every
known API key is scrubbed from the text of each row and ledger note before it is written or raised;
``stop`` (one `safety.Stop`: a `KillSwitch`, a callable, or both combined) is observed with the spend
before each send and during long waits; a stop ends every wait within about a second (``waits``);
``Retry-After`` is honoured up to ``RetryPolicy.retry_after_max_s`` (30 s).

What is not covered: a crash between a server's response and the cache append re-sends that one call
on rerun (the ledger books it in full both times); spend outside this ledger file.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_replication.safety.kill_switch import KillSwitchTriggered
from composer_replication.safety.stop import any_stop

from .backends.base import BILLED_UNKNOWN, TeacherError
from .backends.factory import make_backend
from .backends.openai_compat import OPENROUTER_BASE_URL
from .cache import ResultCache
from .keys import DEFAULT_KEY_ENV, KeyScrubber, resolve_api_key
from .ledger import SpendLedger
from .plan import _Call, plan_calls, price_run
from .prompt import (
    cost_from_tokens,
)
from .types import DEFAULT_TEACHERS, TeacherCallResult, TeacherSpec, TraceState
from .waits import Stopped, StopWatch

log = logging.getLogger(__name__)

__all__ = ["ReplayReport", "RetryPolicy", "plan_calls", "price_run", "replay_states", "replay_trace"]


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

    @property
    def total_usd(self) -> float:
        return self.prior_usd + self.spent_usd


def _needs_key(spec: dict[str, Any]) -> bool:
    return spec.get("backend", "openai") == "openai" and spec.get("base_url", OPENROUTER_BASE_URL).startswith(
        OPENROUTER_BASE_URL
    )


def _known_keys(teachers: Sequence[dict[str, Any]], api_key: str | None) -> KeyScrubber:
    """Every key this process could send: the argument and each teacher's key variable (env, ./.env)."""
    envs = {DEFAULT_KEY_ENV} | {t["api_key_env"] for t in teachers if t.get("api_key_env")}
    return KeyScrubber([api_key, *(resolve_api_key(None, e) for e in sorted(envs))])


def _backend_for(
    spec: dict[str, Any], api_key: str | None, concurrency: int, backends: dict[tuple, Any]
) -> Any:
    """The (shared) backend of one teacher; RuntimeError if it needs a key and none is found."""
    env = spec.get("api_key_env", DEFAULT_KEY_ENV)
    key = resolve_api_key(api_key, env) if (_needs_key(spec) or api_key or "api_key_env" in spec) else None
    if _needs_key(spec) and not key:
        raise RuntimeError(
            f"teacher {spec['slug']!r} needs an API key: pass api_key=..., set ${env}, or put {env}=... in ./.env"
        )
    ident = (spec.get("backend", "openai"), spec.get("base_url"), spec.get("model_path"), key)
    if ident not in backends:
        backends[ident] = make_backend(spec, api_key=key, concurrency=concurrency)
    return backends[ident]


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


async def replay_states(
    states: Sequence[TraceState],
    teachers: Sequence[TeacherSpec] = tuple(DEFAULT_TEACHERS),
    *,
    max_total_usd: float = 5.0,
    api_key: str | None = None,
    cache_path: str | Path | None = None,
    ledger_path: str | Path | None = None,
    concurrency: int = 16,
    max_tokens: int = 1024,
    timeout_s: float = 120.0,
    retry: RetryPolicy | None = None,
    stop: Callable[[], str | None] | None = None,
    kill_switch: Any = None,
    progress: bool = True,
    fsync: bool = False,
) -> ReplayReport:
    """Send every (state, teacher) call not already in ``cache_path``; return all results in order.

    ``ledger_path`` persists the spend so a rerun starts from what was already booked (by default
    it sits beside the cache). ``stop`` and ``kill_switch`` (one `Stop`, see `safety.any_stop`) are
    observed with the spend so far before each send and during long waits; on a reason every wait
    ends (``teacher_replay.waits``: a request in flight gets 0.5 s more, then is abandoned and booked
    in full), then ``KillSwitchTriggered`` is raised.
    """
    if concurrency < 1 or max_tokens < 1:
        raise ValueError("concurrency and max_tokens must be >= 1")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    retry = retry or RetryPolicy()
    halt = any_stop(stop, kill_switch)  # one Stop; a KillSwitch is one, a plain callable becomes one
    calls = plan_calls(states, teachers, max_tokens=max_tokens, timeout_s=timeout_s)
    if ledger_path is None and cache_path is not None:
        ledger_path = Path(cache_path).with_name(Path(cache_path).stem + ".ledger.jsonl")
    cache = ResultCache(cache_path, fsync=fsync)
    scrub = _known_keys([c.spec for c in calls], api_key)
    ledger = SpendLedger(max_total_usd, ledger_path, fsync=fsync)
    report = ReplayReport(results=[], prior_usd=ledger.prior_usd, max_total_usd=ledger.max_total_usd)
    results: dict[str, TeacherCallResult] = {}
    todo: list[_Call] = []
    for c in calls:
        hit = cache.get(c.key)
        if hit is not None:
            results[c.key] = hit
        else:
            todo.append(c)
    report.n_cached = len(results)

    backends: dict[tuple, Any] = {}
    call_backend: dict[str, Any] = {}
    try:
        by_teacher: dict[str, Any] = {}
        for c in todo:
            spec = c.spec
            if spec["slug"] not in by_teacher:
                by_teacher[spec["slug"]] = _backend_for(spec, api_key, concurrency, backends)
            call_backend[c.key] = by_teacher[spec["slug"]]

        sem = asyncio.Semaphore(concurrency)
        state: dict[str, str | None] = {"fatal": None}
        watch = StopWatch(halt, lambda: ledger.spent_usd)
        cooldown: dict[str, float] = {}  # teacher slug -> monotonic time before which nothing is sent
        bar = None
        if progress and todo:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(todo), unit="call", desc="replay", dynamic_ncols=True)

        async def one(call: _Call) -> TeacherCallResult:
            backend = call_backend[call.key]
            attempt = 0
            while True:
                # A Retry-After from one call pauses every call to that teacher, not just the one retried.
                try:
                    await watch.sleep(cooldown.get(call.spec["slug"], 0.0) - time.monotonic())
                except Stopped as stop:
                    return _row(call, error=f"not sent: stopped: {stop.reason}")
                async with sem:
                    if cooldown.get(call.spec["slug"], 0.0) > time.monotonic():
                        continue  # a 429 arrived while we queued: release the slot and wait it out
                    if watch.poll():
                        return _row(call, error=f"not sent: stopped: {watch.reason}")
                    if state["fatal"]:
                        return _row(call, error=f"not sent: {state['fatal']}")
                    res = await ledger.reserve(call.key, call.reserve_usd)
                    if res is None:
                        why = "provider overcharged; run halted" if ledger.overrun else "budget exhausted"
                        return _row(
                            call,
                            error=f"not sent: {why} (${ledger.committed_usd:.6f} of ${ledger.max_total_usd:.6f} "
                            f"booked; this call's worst case is ${call.reserve_usd:.6f})",
                        )
                    t0 = time.perf_counter()
                    report.n_http_requests += 1
                    try:
                        resp = await watch.wait(backend.complete(call.request))
                    except Stopped as stop:  # abandoned in flight: it may have been billed
                        await ledger.settle(res, res.usd, note="stopped in flight: outcome unknown")
                        return _row(
                            call, latency_s=round(time.perf_counter() - t0, 4),
                            error=f"stopped in flight: {stop.reason} (booked in full: it may have been billed)",
                        )  # fmt: skip
                    except TeacherError as exc:
                        latency = time.perf_counter() - t0
                        if exc.cost_usd is not None:
                            await ledger.settle(res, _booked(exc.cost_usd, res.usd), note="error")
                        elif exc.billed == BILLED_UNKNOWN:
                            await ledger.settle(
                                res, res.usd, note=f"outcome unknown: {scrub(str(exc))[:300]}"
                            )
                        else:
                            await ledger.release(res)
                        if exc.fatal:
                            state["fatal"] = f"run halted by {exc}"
                        if exc.retry_after_s:
                            until = time.monotonic() + min(exc.retry_after_s, retry.retry_after_max_s)
                            cooldown[call.spec["slug"]] = max(cooldown.get(call.spec["slug"], 0.0), until)
                        err = exc
                    except BaseException:
                        await ledger.settle(res, res.usd, note="interrupted")
                        raise
                    else:
                        latency = time.perf_counter() - t0
                        cost = resp.cost_usd
                        if cost is None:
                            cost = cost_from_tokens(resp.prompt_tokens, resp.completion_tokens, call.spec)
                        cost = _booked(cost, res.usd)
                        await ledger.settle(res, cost)
                        row = _row(
                            call, response_text=scrub(resp.text), latency_s=round(latency, 4), prompt_tokens=resp.prompt_tokens,
                            completion_tokens=resp.completion_tokens, cost_usd=cost,
                        )  # fmt: skip
                        cache.put(call.key, call.phash, row)
                        await cache.sync()
                        return row
                attempt += 1
                if not err.retryable or attempt >= retry.max_attempts or err.fatal:
                    row = _row(
                        call,
                        latency_s=round(latency, 4),
                        error=f"{scrub(str(err))} (after {attempt} attempt(s))",
                    )
                    cache.put(call.key, call.phash, row)
                    await cache.sync()
                    return row
                try:
                    await watch.sleep(retry.delay(attempt - 1, err.retry_after_s))
                except Stopped as stop:
                    return _row(call, error=f"not sent: stopped: {stop.reason}")

        async def tracked(call: _Call) -> None:
            row = await one(call)
            results[call.key] = row
            report.n_sent += row["error"] is None or not str(row["error"]).startswith("not sent")
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(
                    f"spent ${ledger.spent_usd:.4f} of ${ledger.max_total_usd:.2f}", refresh=False
                )

        watch.start()
        try:
            await asyncio.gather(*(tracked(c) for c in todo))
        finally:
            await watch.close()
            if bar is not None:
                bar.close()
        ledger.refresh()  # what other processes sharing the file booked meanwhile, for the totals
    finally:
        for b in backends.values():
            await b.aclose()
        cache.close()
        ledger.close()

    report.results = [results[c.key] for c in calls]
    report.spent_usd = ledger.settled_usd
    report.prior_usd = ledger.prior_usd
    report.overrun = ledger.over_cap
    for r in report.results:
        if r["error"] is not None:
            report.n_errors += 1
            kind = str(r["error"]).split(":")[0][:40]
            report.errors_by_kind[kind] = report.errors_by_kind.get(kind, 0) + 1
    report.stopped = watch.reason
    if report.stopped:
        raise KillSwitchTriggered(report.stopped)
    return report


async def replay_trace(
    states: Sequence[TraceState],
    teachers: Sequence[TeacherSpec] = tuple(DEFAULT_TEACHERS),
    max_total_usd: float = 5.0,
    api_key: str | None = None,
    *,
    cache_path: str | Path | None = None,
    ledger_path: str | Path | None = None,
    concurrency: int = 16,
    max_tokens: int = 1024,
    timeout_s: float = 120.0,
    retry: RetryPolicy | None = None,
    stop: Callable[[], str | None] | None = None,
    kill_switch: Any = None,
    progress: bool = True,
    fsync: bool = False,
) -> list[TeacherCallResult]:
    """For each state, one call per teacher; the recorded spend never exceeds ``max_total_usd``.

    A thin wrapper over :func:`replay_states` (same keyword options). Returns one row per
    (state, teacher), in order; calls the budget did not allow carry ``error="not sent: ..."``.
    """
    report = await replay_states(
        states,
        teachers,
        max_total_usd=max_total_usd,
        api_key=api_key,
        cache_path=cache_path,
        ledger_path=ledger_path,
        concurrency=concurrency,
        max_tokens=max_tokens,
        timeout_s=timeout_s,
        retry=retry,
        stop=stop,
        kill_switch=kill_switch,
        progress=progress,
        fsync=fsync,
    )
    return report.results
