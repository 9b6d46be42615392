"""Template hints for self-distillation at tool-error sites (SDPO channel).

At an error site the teacher is the same model given the same history plus a short hint inserted after the
failed call; the student learns to act, without the hint, the way the hinted model would. A hint must be
cheap, deterministic and grounded in the context: the tools that exist, the failing tool's schema, and the
error text. ``dispatch(kind, ctx)`` returns ``None`` for kinds without a template (no SDPO signal there).
``hint_for_error`` adapts the registry to ``CollatorConfig.hint_generator``'s ``(error_kind, error_meta)``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from typing import Any, TypedDict

__all__ = [
    "HINT_TEMPLATES",
    "HintContext",
    "dispatch",
    "hint_for_error",
    "hint_edit_mismatch",
    "hint_file_not_found",
    "hint_file_not_read",
    "hint_json_decode",
    "hint_permission_denied",
    "hint_repeated_failure",
    "hint_runtime_error",
    "hint_timeout",
    "hint_tool_not_found",
    "hint_type_error",
    "register",
]


class HintContext(TypedDict, total=False):
    error_kind: str
    error_message: str
    available_tools: list[str]
    tool_name: str
    tool_schema: dict
    intent: str


def _msg(ctx: HintContext, limit: int = 300) -> str:
    m = (ctx.get("error_message") or "").strip().replace("\n", " ")
    return (m[:limit] + "…") if len(m) > limit else m


def _quoted_error(ctx: HintContext) -> str:
    m = _msg(ctx)
    return f' The error was: "{m}".' if m else ""


def _schema_line(ctx: HintContext) -> str:
    schema = ctx.get("tool_schema") or {}
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not props:
        return ""
    required = set(schema.get("required") or [])
    fields = ", ".join(
        f"{k}: {v.get('type', 'any') if isinstance(v, dict) else 'any'}{' (required)' if k in required else ''}"
        for k, v in props.items()
    )
    return f" `{ctx.get('tool_name', 'the tool')}` takes {{{fields}}}."


def hint_tool_not_found(ctx: HintContext) -> str:
    tools = ctx.get("available_tools") or []
    name = ctx.get("tool_name") or ""
    text = (
        f"Reminder: `{name}` is not an available tool." if name else "Reminder: call only tools that exist."
    )
    if tools:
        close = difflib.get_close_matches(name, tools, n=1) if name else []
        text += f" Available tools: {', '.join(tools)}."
        if close:
            text += f" Did you mean `{close[0]}`?"
    return text


def hint_json_decode(ctx: HintContext) -> str:
    return (
        "Reminder: tool arguments must be valid JSON — double-quoted keys and strings, no trailing commas, "
        "special characters escaped." + _schema_line(ctx) + _quoted_error(ctx)
    )


def hint_type_error(ctx: HintContext) -> str:
    name = ctx.get("tool_name") or "the tool"
    return (
        f"Reminder: the arguments passed to `{name}` did not match its input schema; check every required "
        "parameter and its type." + _schema_line(ctx) + _quoted_error(ctx)
    )


def hint_runtime_error(ctx: HintContext) -> str:
    return (
        "Reminder: the last command failed. Read the error output, find its cause, and fix that cause "
        "before running it again." + _quoted_error(ctx)
    )


def hint_repeated_failure(ctx: HintContext) -> str:
    name = ctx.get("tool_name") or "this tool"
    return (
        f"Reminder: this exact `{name}` call has already failed; repeating it will fail the same way. Change "
        "the approach: inspect the state first, or use a different tool or arguments." + _quoted_error(ctx)
    )


def hint_file_not_found(ctx: HintContext) -> str:
    tools = ctx.get("available_tools") or []
    finder = next((t for t in ("Glob", "LS", "Grep") if t in tools), None)
    how = f"use `{finder}`" if finder else "list the directory"
    return (
        f"Reminder: that path does not exist. Check the working directory and {how} to find the right path."
        + _quoted_error(ctx)
    )


def hint_edit_mismatch(ctx: HintContext) -> str:
    return (
        "Reminder: the text to replace must match the file exactly, including whitespace and indentation. Read "
        "the current file content first and copy the exact lines." + _quoted_error(ctx)
    )


def hint_file_not_read(ctx: HintContext) -> str:
    reader = "`Read`" if "Read" in (ctx.get("available_tools") or []) else "a read tool"
    return f"Reminder: read the file with {reader} before editing or writing it."


def hint_permission_denied(ctx: HintContext) -> str:
    return (
        "Reminder: that action is not permitted here. Stay inside the allowed working directory and tools, "
        "or choose an approach that does not need the denied permission." + _quoted_error(ctx)
    )


def hint_timeout(ctx: HintContext) -> str:
    return (
        "Reminder: the command timed out. Run a narrower or faster command, add a timeout, or run it in the "
        "background and poll its output."
    )


HINT_TEMPLATES: dict[str, Callable[[HintContext], str]] = {
    "tool_not_found": hint_tool_not_found,
    "json_decode": hint_json_decode,
    "type_error": hint_type_error,
    "runtime_error": hint_runtime_error,
    "repeated_failure": hint_repeated_failure,
    "file_not_found": hint_file_not_found,
    "edit_mismatch": hint_edit_mismatch,
    "file_not_read": hint_file_not_read,
    "permission_denied": hint_permission_denied,
    "timeout": hint_timeout,
    "hook_blocked": hint_runtime_error,
}


def dispatch(error_kind: str, ctx: HintContext | None = None) -> str | None:
    """The hint for ``error_kind`` in context ``ctx``, or ``None`` if no template is registered."""
    fn = HINT_TEMPLATES.get(error_kind)
    if fn is None:
        return None
    full: HintContext = {"error_kind": error_kind, **(ctx or {})}
    return fn(full)


def register(error_kind: str, fn: Callable[[HintContext], str]) -> None:
    """Add or override the template for ``error_kind``."""
    if not callable(fn):
        raise ValueError(f"register({error_kind!r}, ...): fn must be callable (HintContext) -> str")
    HINT_TEMPLATES[error_kind] = fn


def hint_for_error(error_kind: str, error_meta: dict[str, Any] | None) -> str | None:
    """Adapter usable as ``CollatorConfig.hint_generator``: builds a :class:`HintContext` from ``error_meta``."""
    meta = error_meta or {}
    ctx: HintContext = {}
    for key in ("error_message", "available_tools", "tool_name", "tool_schema", "intent"):
        if meta.get(key) is not None:
            ctx[key] = meta[key]
    if "tool_schema" not in ctx and isinstance(meta.get("tool_input"), dict):
        # No schema in the logs: describe the call that was made, which is what the model needs to fix.
        ctx["intent"] = ctx.get("intent") or json.dumps(meta["tool_input"], ensure_ascii=False)[:200]
    return dispatch(error_kind, ctx)
