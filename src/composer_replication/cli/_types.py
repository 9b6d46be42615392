"""argparse value types that reject out-of-range numbers with a usage error naming the flag's rule."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)


def _number(kind: Callable[[str], N], text: str) -> N:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {'an integer' if kind is int else 'a number'}"
        ) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _at_least(kind: Callable[[str], N], text: str, low: N, *, strict: bool) -> N:
    """``text`` parsed by ``kind``; a usage error unless it is >= ``low`` (> ``low`` when ``strict``)."""
    value = _number(kind, text)
    if value < low or (strict and value == low):
        raise argparse.ArgumentTypeError(f"{value} must be {'>' if strict else '>='} {low}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _at_least(int, text, 1, strict=False)


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return _at_least(int, text, 0, strict=False)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _at_least(float, text, 0.0, strict=True)


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    return _at_least(float, text, 0.0, strict=False)


MAX_AUTO_JOBS = 8


def auto_jobs() -> int:
    """One worker per CPU core this process may run on, at most :data:`MAX_AUTO_JOBS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_AUTO_JOBS))


MAX_JOBS = 256  # a typo such as 10000 would otherwise fork that many processes over a large tree


def jobs(text: str) -> int:
    """``auto`` (:func:`auto_jobs`) or an integer from 1 to :data:`MAX_JOBS`."""
    if text.strip().lower() == "auto":
        return auto_jobs()
    value = positive_int(text)
    if value > MAX_JOBS:
        raise argparse.ArgumentTypeError(f"{value} must be <= {MAX_JOBS} (or auto: one per CPU core)")
    return value
