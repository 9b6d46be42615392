"""Fan states out to teachers under a hard dollar cap, with retries, a cache and a kill switch.

What is covered: each (state, teacher) call is sent at most once per successful result across runs
(results append to a JSONL cache; a rerun sends only what is missing); the ledger reserves each
call's worst case before sending, so the recorded spend never exceeds ``max_total_usd`` while
providers bill at most the spec's prices, even with other processes sharing the ledger file (see
``ledger.py``); no settle path books an amount below zero; 408/429/5xx, timeouts (one overall
deadline per attempt) and unreadable bodies are retried with exponential backoff and full jitter,
honouring ``Retry-After``; a call that still fails becomes a result row with ``error`` set; every
known API key is scrubbed from the text of each row and ledger note before it is written or raised;
``stop`` (one `safety.Stop`: a `KillSwitch`, or a callable via `safety.as_stop`) is observed with the spend
before each send and during long waits; a stop ends every wait within about a second (``waits``);
``Retry-After`` is honoured up to ``RetryPolicy.retry_after_max_s`` (30 s).

What is not covered: a crash between a server's response and the cache append re-sends that one call
on rerun (the ledger books it in full both times); spend outside this ledger file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from composer_replication.config.run import (
    MAX_TOTAL_USD,
    REPLAY_CONCURRENCY,
    REPLAY_MAX_TOKENS,
    REPLAY_TIMEOUT_S,
)
from composer_replication.safety.stop import Stop, as_stop

from .cache import ResultCache
from .ledger import SpendLedger
from .plan import plan_calls, price_run
from .run import ReplayReport, ReplayRun, RetryPolicy, known_keys
from .types import DEFAULT_TEACHERS, TeacherCallResult, TeacherSpec, TraceState

__all__ = ["ReplayReport", "RetryPolicy", "plan_calls", "price_run", "replay_states", "replay_trace"]


async def replay_states(
    states: Sequence[TraceState],
    teachers: Sequence[TeacherSpec] = tuple(DEFAULT_TEACHERS),
    *,
    max_total_usd: float = MAX_TOTAL_USD,
    api_key: str | None = None,
    cache_path: str | Path | None = None,
    ledger_path: str | Path | None = None,
    concurrency: int = REPLAY_CONCURRENCY,
    max_tokens: int = REPLAY_MAX_TOKENS,
    timeout_s: float = REPLAY_TIMEOUT_S,
    retry: RetryPolicy | None = None,
    stop: Stop | Callable[[], str | None] | None = None,
    progress: bool = True,
    fsync: bool = False,
) -> ReplayReport:
    """Send every (state, teacher) call not already in ``cache_path``; return all results in order.

    ``ledger_path`` persists the spend so a rerun starts from what was already booked (by default
    it sits beside the cache). ``stop`` (a `safety.Stop` such as a `KillSwitch`, or a callable
    returning a reason or None) is observed with the spend so far before each send and during long waits; on a reason every wait
    ends (``teacher_replay.waits``: a request in flight gets 0.5 s more, then is abandoned and booked
    in full), then ``KillSwitchTriggered`` is raised.
    """
    if concurrency < 1 or max_tokens < 1:
        raise ValueError("concurrency and max_tokens must be >= 1")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    calls = plan_calls(states, teachers, max_tokens=max_tokens, timeout_s=timeout_s)
    if ledger_path is None and cache_path is not None:
        ledger_path = Path(cache_path).with_name(Path(cache_path).stem + ".ledger.jsonl")
    cache = ResultCache(cache_path, fsync=fsync)
    run = ReplayRun(
        calls, cache=cache, ledger=SpendLedger(max_total_usd, ledger_path, fsync=fsync),
        scrub=known_keys([c.spec for c in calls], api_key), retry=retry or RetryPolicy(),
        stop=as_stop(stop), concurrency=concurrency,
    )  # fmt: skip
    try:
        run.open_backends(api_key)
        await run.run(progress=progress)
    finally:
        await run.aclose()
    return run.report()


async def replay_trace(
    states: Sequence[TraceState],
    teachers: Sequence[TeacherSpec] = tuple(DEFAULT_TEACHERS),
    max_total_usd: float = MAX_TOTAL_USD,
    api_key: str | None = None,
    *,
    cache_path: str | Path | None = None,
    ledger_path: str | Path | None = None,
    concurrency: int = REPLAY_CONCURRENCY,
    max_tokens: int = REPLAY_MAX_TOKENS,
    timeout_s: float = REPLAY_TIMEOUT_S,
    retry: RetryPolicy | None = None,
    stop: Stop | Callable[[], str | None] | None = None,
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
        progress=progress,
        fsync=fsync,
    )
    return report.results
