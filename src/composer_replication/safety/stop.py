"""The one stop type every long loop takes: ``stop()`` says why to stop (or None), ``stop.observe(...)``
feeds it the loop's metrics.

A `KillSwitch` is a `Stop`. So is any zero-argument callable returning a reason or None, once wrapped by
`as_stop` (its ``observe`` just polls it). Loops take one argument, ``stop`` (never ``kill_switch``:
that is the module and its type, not a parameter), and call `as_stop` on it first; `any_stop` combines
several into one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Stop(Protocol):
    """Polled between steps; fed metrics (``step``, ``loss``, ``grad_norm``, ``kl``, ``reward``,
    ``spend_usd``...) as they happen. Both return the reason to stop, or None."""

    def __call__(self) -> str | None: ...

    def observe(self, **metrics: Any) -> str | None: ...


class _Polled:
    """A plain ``() -> reason | None`` callable as a `Stop` (metrics are not its business)."""

    def __init__(self, poll: Callable[[], str | None]) -> None:
        self._poll = poll

    def __call__(self) -> str | None:
        return self._poll()

    def observe(self, **metrics: Any) -> str | None:
        return self._poll()


def _never() -> str | None:
    return None


NEVER: Stop = _Polled(_never)


class _First:
    """Several stops as one: the first reason wins; ``observe`` feeds every one of them."""

    def __init__(self, stops: list[Stop]) -> None:
        self._stops = stops

    def __call__(self) -> str | None:
        for stop in self._stops:
            if (reason := stop()) is not None:
                return reason
        return None

    def observe(self, **metrics: Any) -> str | None:
        reasons = [stop.observe(**metrics) for stop in self._stops]
        return next((r for r in reasons if r is not None), None)


def any_stop(*stops: Stop | Callable[[], str | None] | None) -> Stop:
    """One `Stop` that stops when any of ``stops`` does (polled in order; None entries are left out).

    One of them alone is `as_stop` of it, none is `NEVER`.
    """
    given = [as_stop(s) for s in stops if s is not None]
    if not given:
        return NEVER
    return given[0] if len(given) == 1 else _First(given)


def as_stop(stop: Stop | Callable[[], str | None] | None = None) -> Stop:
    """One `Stop` from what a caller passed: a `Stop` (a `KillSwitch`), a plain callable, or None (never)."""
    if stop is None:
        return NEVER
    if isinstance(stop, Stop):
        return stop
    if not callable(stop):
        raise TypeError(f"stop must be a KillSwitch or a callable returning a reason or None, got {stop!r}")
    return _Polled(stop)
