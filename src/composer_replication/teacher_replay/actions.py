"""The student-action text format and its canonical form (the shared contract).

Action text: the assistant turn's content blocks in order, separated by a blank line. A text block is
its text; a tool call is one line ``[TOOL_USE] name=<tool> input=<json>``; a thinking block is
``[THINKING] <text>``. Two actions agree iff their canonical forms are equal: the tuple of
``(name, json.dumps(input, sort_keys=True, separators=(",", ":")))`` when there are tool calls,
otherwise the text with whitespace collapsed; thinking is ignored.

Teachers are asked for the same format, but real model output drifts (code fences, prose around the
tool line, trailing commas are not fixed); :func:`parse_action` accepts a tool line anywhere in the text
and rejects a tool line whose JSON does not parse, so a malformed response never agrees with anything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_TOOL_RE = re.compile(r"^\s*\[TOOL_USE\]\s+name=(\S+)\s+input=(.*)$")
_THINK_PREFIX = "[THINKING]"
_WS = re.compile(r"\s+")

CanonicalAction = tuple[tuple[str, str], ...] | str


@dataclass(frozen=True)
class ParsedAction:
    """An action split into its parts. ``errors`` lists tool lines that could not be parsed."""

    text: str
    tool_calls: tuple[tuple[str, Any], ...] = ()
    errors: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.errors


def format_tool_use(name: str, args: Any) -> str:
    """One tool call in the contract's line format."""
    return f"[TOOL_USE] name={name} input={json.dumps(args, ensure_ascii=False)}"


def _strip_fences(text: str) -> str:
    # Chat models like wrapping the answer in ```...```; the fence lines carry no action.
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith("```"))


def parse_action(text: str | None) -> ParsedAction:
    """Parse action text into prose and tool calls (thinking blocks dropped)."""
    if text is None:
        return ParsedAction(text="", errors=("no response",))
    text = _strip_fences(text)
    prose: list[str] = []
    calls: list[tuple[str, Any]] = []
    errors: list[str] = []
    in_thinking = False
    for line in text.splitlines():
        m = _TOOL_RE.match(line)
        if m:
            in_thinking = False
            name, raw = m.group(1), m.group(2).strip()
            try:
                calls.append((name, json.loads(raw)))
            except json.JSONDecodeError as exc:
                errors.append(f"tool {name}: input is not JSON ({exc.msg})")
            continue
        if line.lstrip().startswith(_THINK_PREFIX):
            in_thinking = True  # a thinking block runs until the next blank line
            continue
        if in_thinking:
            if not line.strip():
                in_thinking = False
            continue
        prose.append(line)
    return ParsedAction(text="\n".join(prose).strip(), tool_calls=tuple(calls), errors=tuple(errors))


def canonical_action(text: str | None) -> CanonicalAction | None:
    """The canonical form of an action, or None when it is empty or malformed."""
    parsed = parse_action(text)
    if not parsed.ok:
        return None
    if parsed.tool_calls:
        return tuple(
            (name, json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
            for name, args in parsed.tool_calls
        )
    collapsed = _WS.sub(" ", parsed.text).strip()
    return collapsed or None


def render_canonical(action: CanonicalAction) -> str:
    """Canonical action back to contract text (tool lines, or the collapsed text)."""
    if isinstance(action, str):
        return action
    return "\n\n".join(f"[TOOL_USE] name={name} input={args}" for name, args in action)
