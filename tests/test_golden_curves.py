"""Golden loss curves: 10 steps of each training mode on the tiny model reproduce the committed curves.

A refactor must not move the numerics. If a change moves them on purpose, regenerate the curves
(``python3 scripts/golden_curves.py``, see docs/training.md) and commit them with that change.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("golden_curves", ROOT / "scripts" / "golden_curves.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)


def _golden(mode: str) -> dict:
    return json.loads((golden.ASSETS / f"{mode}_tiny.json").read_text())


@pytest.mark.parametrize("mode", ["offline", pytest.param("grpo", marks=pytest.mark.slow)])  # grpo: ~50 s
def test_training_reproduces_the_golden_curve(mode):
    record = _golden(mode)
    assert record["config"] == golden.config(mode), "the recorded config changed: regenerate on purpose"
    got = golden.curve(mode)
    assert golden.differences(mode, got, record["curves"]) == []


def test_the_comparison_catches_a_small_change():
    """The tolerance is tight: one step's value off by 0.1% fails."""
    want = _golden("offline")["curves"]
    moved = {k: list(v) for k, v in want.items()}
    moved["loss/lm_ce"][4] *= 1.001
    assert golden.differences("offline", moved, want) == [
        f"offline loss/lm_ce step 5: {moved['loss/lm_ce'][4]!r} != golden {want['loss/lm_ce'][4]!r}"
    ]
