"""Teacher replay (API reference §6): N teachers × states under a hard dollar cap, and consensus pairs.

``import composer_replication.teacher_replay`` stays light: httpx is imported only when a call to an
HTTP teacher is made, transformers only for the in-process backend.
"""

from __future__ import annotations

from .client import replay_trace
from .pairs import extract_dpo_pairs, save_pairs
from .types import DEFAULT_TEACHERS, DPOPair, TeacherCallResult, TeacherSpec, TraceState

__all__ = [
    "DEFAULT_TEACHERS",
    "DPOPair",
    "TeacherCallResult",
    "TeacherSpec",
    "TraceState",
    "extract_dpo_pairs",
    "replay_trace",
    "save_pairs",
]
