"""The one stop type every long loop takes: ``stop()`` says why to stop (or None), ``stop.observe(...)``
feeds it the loop's metrics.

A `KillSwitch` is a `Stop`. So is any zero-argument callable returning a reason or None, once wrapped by
`as_stop` (its ``observe`` just polls it). Loops take one argument, ``stop``, and call `as_stop` on it
first; functions whose public signature also had ``kill_switch=`` accept it as another name for ``stop``.
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


def as_stop(stop: Stop | Callable[[], str | None] | None = None, *, kill_switch: Any = None) -> Stop:
    """One `Stop` from what a caller passed: a `Stop` (a `KillSwitch`), a plain callable, or None (never).

    ``kill_switch`` is the older name of the same argument; passing two different objects is an error.
    """
    if kill_switch is not None:
        if stop is not None and stop is not kill_switch:
            raise TypeError(
                "pass the kill switch once, as stop=...; stop= and kill_switch= name the same argument"
            )
        stop = kill_switch
    if stop is None:
        return NEVER
    if isinstance(stop, Stop):
        return stop
    if not callable(stop):
        raise TypeError(f"stop must be a KillSwitch or a callable returning a reason or None, got {stop!r}")
    return _Polled(stop)
