"""argparse value types that reject out-of-range numbers with a usage error naming the flag's rule."""

from __future__ import annotations

import argparse
import math
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


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _number(float, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _number(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value
