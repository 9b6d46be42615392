"""Normalisation layer over teacher replay (API reference §7): data-juicer dedup and filters.

data_juicer is imported only when a ``DJNormalizer`` that runs it is built.
"""

from __future__ import annotations

from composer_replication.teacher_replay import DPOPair, TeacherCallResult, extract_dpo_pairs, replay_trace

from .normalize import (
    DJNormalizer,
    NormalizedDPOPair,
    NormalizeReport,
    replay_and_normalize_trace,
    replay_and_normalize_trace_sync,
)

__all__ = [
    "DJNormalizer",
    "DPOPair",
    "NormalizedDPOPair",
    "NormalizeReport",
    "TeacherCallResult",
    "extract_dpo_pairs",
    "replay_and_normalize_trace",
    "replay_and_normalize_trace_sync",
    "replay_trace",
]
