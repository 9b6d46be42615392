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
    TOOL_MODES,
    build_messages,
    cost_from_tokens,
    prompt_token_bound,
    prompt_token_estimate,
    request_tools,
    tool_names,
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
    tool_mode: str = "native"  # "native": asked with ``tools``; "text": the text action format
    twin: _Call | None = None  # a native call's text-format twin, sent if the endpoint refuses tools
    tool_names: tuple[str, ...] = ()  # the session's tools: a call to another one is malformed


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
        variants: dict[str, Any] = {"names": tool_names(state)}
        for spec in teachers:
            mode = _tool_mode(spec)
            call = _plan_one(state, spec, mode, variants, max_tokens, timeout_s)
            if mode == "native":
                call.twin = _plan_one(state, spec, "text", variants, max_tokens, timeout_s)
            calls.append(call)
    return calls


def _tool_mode(spec: TeacherSpec) -> str:
    mode = spec.get("tool_mode", "native")
    if mode not in TOOL_MODES:
        raise ValueError(f"teacher {spec['slug']!r}: tool_mode is {mode!r}; use 'native' (tools) or 'text'")
    return mode


def _plan_one(
    state: dict[str, Any], spec: TeacherSpec, mode: str, variants: dict[str, Any], max_tokens: int,
    timeout_s: float,
) -> _Call:  # fmt: skip
    """One request of ``state`` to ``spec`` in ``mode``; ``variants`` holds each mode's messages, tools
    and token bounds, built once per state."""
    if mode not in variants:
        tools = request_tools(state) or None if mode == "native" else None
        messages = build_messages(state, mode=mode)
        variants[mode] = (
            messages,
            tools,
            prompt_token_bound(messages, tools),
            prompt_token_estimate(messages, tools),
        )
    messages, tools, bound, est = variants[mode]
    req = ChatRequest(
        model=spec.get("model", spec["slug"]), messages=messages, max_tokens=max_tokens,
        temperature=float(spec.get("temperature", 0.0)), timeout_s=timeout_s,
        extra_body=dict(spec.get("extra_body") or {}), tools=tools,
    )  # fmt: skip
    payload = {"model": req.model, "messages": messages, "max_tokens": max_tokens,
               "temperature": req.temperature, "extra": req.extra_body}  # fmt: skip
    if mode == "native":  # a request with tools never shares a key with a text request
        payload |= {"tool_mode": mode, "tools": tools}
    phash = prompt_hash(payload)
    return _Call(
        state=state, spec=dict(spec), request=req, key=call_key(state["state_id"], spec["slug"], phash),
        phash=phash, reserve_usd=worst_case_usd(bound, max_tokens, spec),
        expected_usd=cost_from_tokens(est, min(max_tokens, 256), spec), tool_mode=mode,
        tool_names=variants["names"],
    )  # fmt: skip


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
