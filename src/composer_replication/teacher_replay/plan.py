"""Plan a replay: every (state, teacher) request, its cache key, and its worst-case and expected cost."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_replication.config.run import REPLAY_MAX_TOKENS, REPLAY_TIMEOUT_S

from .backends.base import ChatRequest
from .cache import ResultCache, call_key, prompt_hash
from .prompt import (
    build_messages,
    cost_from_tokens,
    prompt_token_bound,
    prompt_token_estimate,
    worst_case_usd,
)
from .types import DEFAULT_TEACHERS, TeacherSpec, TraceState


@dataclass
class _Call:
    state: dict[str, Any]
    spec: dict[str, Any]
    request: ChatRequest
    key: str
    phash: str
    reserve_usd: float
    expected_usd: float


def _validate_states(states: Sequence[TraceState]) -> list[dict[str, Any]]:
    out = []
    seen: set[str] = set()
    for i, s in enumerate(states):
        for k in ("state_id", "messages", "student_action"):
            if k not in s:
                raise ValueError(
                    f"state #{i}: missing field {k!r} (a TraceState needs state_id, messages, student_action)"
                )
        msgs = s["messages"]
        if not isinstance(msgs, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in msgs
        ):
            raise ValueError(
                f"state #{i} ({s['state_id']!r}): messages must be a list of {{role, content}} dicts with string content"
            )
        if s["state_id"] in seen:
            raise ValueError(f"state #{i}: duplicate state_id {s['state_id']!r}")
        seen.add(s["state_id"])
        out.append(dict(s))
    return out


def _validate_spec(spec: TeacherSpec) -> None:
    """Prices are finite numbers >= 0 (the worst case is built on them); an HTTP teacher's URL is http(s)."""
    for k in ("slug", "input_per_mtok", "output_per_mtok"):
        if k not in spec:
            raise ValueError(f"teacher spec {spec!r}: missing {k!r}")
    for k, v in (("input_per_mtok", spec["input_per_mtok"]), ("output_per_mtok", spec["output_per_mtok"])):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v < math.inf):
            raise ValueError(
                f"teacher {spec['slug']!r}: {k} is {v!r}; a price must be a finite number >= 0 (USD per million tokens)"
            )
    if spec.get("backend", "openai") == "openai" and "base_url" in spec:
        from composer_replication.config.base import check_base_url

        check_base_url(spec["base_url"], f"teacher {spec['slug']!r}: base_url")


def plan_calls(
    states: Sequence[TraceState],
    teachers: Sequence[TeacherSpec],
    *,
    max_tokens: int,
    timeout_s: float = REPLAY_TIMEOUT_S,
) -> list[_Call]:
    """Every (state, teacher) request with its cache key and its worst-case and expected cost."""
    slugs = [t.get("slug") for t in teachers]
    if len(set(slugs)) != len(slugs):
        raise ValueError(f"teacher slugs must be unique, got {slugs}")
    for spec in teachers:
        _validate_spec(spec)
    calls = []
    for state in _validate_states(states):
        messages = build_messages(state)
        bound = prompt_token_bound(messages)
        est = prompt_token_estimate(messages)
        for spec in teachers:
            req = ChatRequest(
                model=spec.get("model", spec["slug"]),
                messages=messages,
                max_tokens=max_tokens,
                temperature=float(spec.get("temperature", 0.0)),
                timeout_s=timeout_s,
                extra_body=dict(spec.get("extra_body") or {}),
            )
            phash = prompt_hash(
                {"model": req.model, "messages": messages, "max_tokens": max_tokens,
                 "temperature": req.temperature, "extra": req.extra_body}
            )  # fmt: skip
            calls.append(
                _Call(
                    state=state, spec=dict(spec), request=req, key=call_key(state["state_id"], spec["slug"], phash),
                    phash=phash, reserve_usd=worst_case_usd(bound, max_tokens, spec),
                    expected_usd=cost_from_tokens(est, min(max_tokens, 256), spec),
                )
            )  # fmt: skip
    return calls


def price_run(
    states: Sequence[TraceState],
    teachers: Sequence[TeacherSpec] = tuple(DEFAULT_TEACHERS),
    *,
    max_tokens: int = REPLAY_MAX_TOKENS,
    cache_path: str | Path | None = None,
) -> dict[str, Any]:
    """Price a run before spending: worst case (the reservations) and expected (~4 bytes/token,
    min(max_tokens, 256) completion tokens), excluding calls already in the cache."""
    calls = plan_calls(states, teachers, max_tokens=max_tokens)
    cache = ResultCache(cache_path) if cache_path is not None and Path(cache_path).exists() else None
    todo = [c for c in calls if cache is None or cache.get(c.key) is None]
    per_teacher: dict[str, dict[str, float]] = {}
    for c in todo:
        t = per_teacher.setdefault(c.spec["slug"], {"calls": 0, "worst_usd": 0.0, "expected_usd": 0.0})
        t["calls"] += 1
        t["worst_usd"] += c.reserve_usd
        t["expected_usd"] += c.expected_usd
    return {
        "calls_total": len(calls),
        "calls_cached": len(calls) - len(todo),
        "calls_to_send": len(todo),
        "worst_case_usd": sum(c.reserve_usd for c in todo),
        "expected_usd": sum(c.expected_usd for c in todo),
        "per_teacher": per_teacher,
    }
