"""The student-action text format and its canonical form (re-exported from :mod:`composer_replication.wire`),
and how a teacher's answer is read and voted with.

``wire`` owns the format (one rendering of a trace for every path); these names stay importable here.
:func:`answer_text` turns an answer (content plus an endpoint's own ``tool_calls``) into the text a
``TeacherCallResult`` records; :func:`teacher_vote` is what consensus counts of it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from composer_replication import wire
from composer_replication.generation.types import Completion
from composer_replication.generation.types import action_text as _completion_text
from composer_replication.wire import (
    CanonicalAction,
    ParsedAction,
    canonical_action,
    format_tool_use,
    parse_action,
    render_canonical,
)

__all__ = [
    "CanonicalAction",
    "ParsedAction",
    "answer_text",
    "canonical_action",
    "format_tool_use",
    "parse_action",
    "render_canonical",
    "teacher_vote",
]


def answer_text(content: str, calls: list[Any] | None) -> str:
    """The action text of an answer: its content and its tool calls (OpenAI ``tool_calls``, or Hermes
    ``<tool_call>`` blocks an in-process model writes) read by ``wire.parse_openai_message``. A
    well-formed answer with calls is prose plus one tool line per call (the canonical text); one without
    calls, or in the text format already, is its content verbatim. A malformed one keeps everything as
    it came (server calls written so that ``wire`` reads them back as malformed): nothing is lost."""
    parsed = wire.parse_openai_message({"content": content, "tool_calls": calls or []})
    if parsed.ok:
        if parsed.tool_calls and (calls or wire.TOOL_CALL_OPEN in content):
            return wire.action_text(parsed.text, parsed.tool_calls)
        return content
    return _completion_text(Completion(content, "stop", 0, 0, tool_calls=calls or None))


def teacher_vote(text: str | None, tools: Collection[str] = ()) -> tuple[CanonicalAction | None, str | None]:
    """``(canonical action, None)`` for an answer that counts as a vote, else ``(None, reason)``: a
    malformed call (arguments not a JSON object, an empty or bad name, too many calls), a call the
    server gave without a usable name, a tool the session does not have (when ``tools`` names them),
    or an empty answer. The reason is one line."""
    parsed = parse_action(text)
    if parsed.errors:
        return None, parsed.errors[0]
    for name, args in parsed.tool_calls:
        if name == "_invalid":
            return None, str(args.get("error") if isinstance(args, dict) else "malformed tool call")[:200]
        if tools and name not in tools:
            return None, f"unknown tool {name[:60]!r} (the session's tools: {', '.join(sorted(tools))[:200]})"
    canon = canonical_action(text)
    return (canon, None) if canon is not None else (None, "empty answer")
