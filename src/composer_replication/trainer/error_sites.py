"""Error sites: the failed tool calls of traces that the agent answered, as prompts for a model.

An :class:`ErrorSite` (``error_sites`` of ``TraceExample`` rows) is the history up to the first assistant
turn after a failed tool call, the hint for that failure (``hint_generator``) and the recorded recovery
(what the agent did next). The offline loop's on-policy SDPO samples at the sites of the training traces
(``trainer.offline.onpolicy``); evaluation measures a model at the sites of held-out traces
(``trainer.evaluation.sites``). :func:`site_prompts` renders a site for the student (no hint) and for the
hinted teacher, so both see the same history.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from composer_replication import encoding, tool_schemas, wire


@dataclass(frozen=True)
class ErrorSite:
    """One recovery point: ``turns`` end with the failed tool result(s); ``recovery`` is what the agent did."""

    site_id: str
    turns: tuple[dict, ...]
    hint: str | None  # None: no template for this error kind (e.g. the user rejected the call)
    recovery: str
    error_kind: str
    tools: tuple[str, ...] = ()  # the session's tool names (scoring: an answer naming another is not valid)
    schemas: tuple[dict, ...] = ()  # their schemas, rendered with the prompt (``wire.trace_tool_schemas``)


def error_sites(
    traces: Sequence[dict],
    hint_generator: Callable[[str, dict], str | None] | None = None,
    *,
    need_hint: bool = True,
) -> list[ErrorSite]:
    """Every error site of ``traces`` with a recorded recovery (and a hint, unless ``need_hint=False``),
    deduplicated across overlapping trace windows. A site is the history up to the first assistant turn
    after a failed tool call; its hint comes from the last failure before that turn (as in the collator)."""
    if hint_generator is None:
        from composer_replication.hint_generator import hint_for_error

        hint_generator = hint_for_error
    out: list[ErrorSite] = []
    seen: set[str] = set()
    for trace in traces:
        turns = list(trace.get("turns") or [])
        for j, turn in enumerate(turns):
            if turn.get("role") != "assistant":
                continue
            k = j - 1  # the last failed tool call since the previous assistant turn
            while k >= 0 and turns[k].get("role") != "assistant":
                if turns[k].get("role") == "tool" and turns[k].get("tool_error") is not None:
                    break
                k -= 1
            if k < 0 or turns[k].get("role") == "assistant":
                continue
            meta = dict(turns[k].get("error_meta") or {})
            meta.setdefault("error_message", turns[k].get("tool_error"))
            kind = str(meta.get("error_kind") or "runtime_error")
            hint = hint_generator(kind, meta)
            recovery = str(turn.get("content") or "")
            if (need_hint and not hint) or not recovery.strip():
                continue
            blob = json.dumps([turns[max(0, j - 4) : j], recovery], sort_keys=True, default=str)
            key = hashlib.sha256(blob.encode()).hexdigest()[:16]
            if key in seen:
                continue
            seen.add(key)
            sid = f"{trace.get('trace_id')}::{key}"
            tools, schemas = tuple(wire.trace_tools(trace)), tuple(wire.trace_tool_schemas(trace))
            out.append(ErrorSite(sid, tuple(turns[:j]), hint or None, recovery, kind, tools, schemas))
    return out


def site_tools(site: ErrorSite) -> list[dict]:
    """The tool schemas the site's prompt is rendered with (from its tool names when it has none)."""
    return list(site.schemas) or tool_schemas.tools_for(None, site.tools)


def site_messages(site: ErrorSite, *, hinted: bool) -> list[dict]:
    """Chat messages of the history at ``site`` in the ``wire`` format (the system message, then the
    turns; rendered with :func:`site_tools`); ``hinted`` appends the hint to the error message."""
    msgs, _ = wire.turns_to_messages(site.turns, wire.SYSTEM_PROMPT)
    if not hinted:
        return msgs
    if not site.hint:
        raise ValueError(f"site {site.site_id} has no hint (error kind {site.error_kind})")
    return wire.add_hint(msgs, site.hint)


def prompt_ids(tok: Any, messages: list[dict], max_len: int, tools: list[dict] | None = None) -> list[int]:
    """Token ids of ``messages`` (with ``tools``) plus the generation prompt, oldest tokens dropped beyond
    ``max_len``."""
    return encoding.render_prompt_ids(tok, messages, tools)[-max_len:]


def site_prompts(tok: Any, site: ErrorSite, max_len: int) -> tuple[list[int], list[int] | None]:
    """The student's prompt at ``site`` (at most ``max_len`` tokens, oldest dropped) and the teacher's
    (None without a hint): the same history plus the hint. The hint goes at the end of the last
    message, so dropping as many oldest tokens from the hinted render as from the plain one leaves the
    teacher exactly the student's history; cutting both at ``max_len`` would make the hint cost the
    teacher history the student sees (a teacher worse than its student at short windows)."""
    tools = site_tools(site)
    full = encoding.render_prompt_ids(tok, site_messages(site, hinted=False), tools)
    student = full[-max_len:]
    if not site.hint:
        return student, None
    hinted = encoding.render_prompt_ids(tok, site_messages(site, hinted=True), tools)
    return student, hinted[-(len(student) + max(0, len(hinted) - len(full))) :]
