"""Classify a failed tool call into an ``error_kind`` (the key the hint generator dispatches on).

Both agents report failures loosely: Claude Code sets ``is_error`` on most failures but not on every failing
Bash command; Codex never sets a flag and reports exit codes in the output. :func:`detect_failure` decides
*whether* a result is an error, :func:`classify_error` decides *which* kind. Rules are ordered from the most
specific message to the most generic; the first match wins.
"""

from __future__ import annotations

import re
from typing import Any

ERROR_KINDS: tuple[str, ...] = (
    "tool_not_found",
    "json_decode",
    "type_error",
    "permission_denied",
    "user_rejected",
    "timeout",
    "file_not_found",
    "edit_mismatch",
    "file_not_read",
    "output_too_large",
    "hook_blocked",
    "interrupted",
    "runtime_error",
    "repeated_failure",
)

_RULES: list[tuple[str, re.Pattern[str]]] = [
    (
        "tool_not_found",
        re.compile(
            r"No such tool available|[Uu]nknown tool|[Tt]ool .{0,40} (?:not found|does not exist)"
            r"|is not a valid tool|unsupported call|unknown function|[Uu]nsupported tool"
        ),
    ),
    (
        "json_decode",
        re.compile(
            r"JSONDecodeError|[Ii]nvalid JSON|failed to parse (?:function )?arguments|Expecting value: line"
            r"|[Uu]nexpected token .{0,20} in JSON|could not parse .{0,20}json"
        ),
    ),
    (
        "type_error",
        # The tool call's arguments did not fit the tool's schema. A bare "TypeError" is not enough: it is what
        # failing programs print (a JavaScript build, a Python traceback), not a malformed call.
        re.compile(
            r"InputValidationError|invalid_type|[Rr]equired parameter .{0,40} is missing"
            r"|[Uu]nexpected (?:parameter|keyword argument)|[Ii]nvalid (?:parameter|argument)s?\b"
            r"|expected .{0,20}, (?:got|received) "
        ),
    ),
    (
        "user_rejected",
        re.compile(r"user doesn't want to proceed|User rejected tool use|rejected by (?:the )?user"),
    ),
    (
        "permission_denied",
        re.compile(
            r"[Pp]ermission denied|EACCES|[Oo]peration not permitted|requires approval|sandbox denied"
        ),
    ),
    ("timeout", re.compile(r"[Tt]imed out|TimeoutError|[Tt]imeout (?:exceeded|expired)|Command timed out")),
    (
        "edit_mismatch",
        re.compile(
            r"String to replace not found|[Ff]ound \d+ matches of the string|old_string|"
            r"apply_patch verification failed|[Ff]ailed to (?:apply|find) (?:patch|context)"
        ),
    ),
    ("file_not_read", re.compile(r"File has not been read yet|[Rr]ead it first before")),
    (
        "file_not_found",
        re.compile(
            r"[Nn]o such file or directory|File does not exist|ENOENT|FileNotFoundError|[Pp]ath does not exist"
        ),
    ),
    ("output_too_large", re.compile(r"exceeds maximum allowed|[Oo]utput too large|exceeds the maximum")),
    ("hook_blocked", re.compile(r"hook error|[Hh]ook (?:blocked|denied)|[Pp]re-commit validation failed")),
    ("interrupted", re.compile(r"\[Request interrupted|[Ii]nterrupted by user")),
]

# Lower-case literals one of which every match of the rule contains (each alternative of the rule holds one):
# a rule's regex runs only when its literal test passes, so a long output costs a few substring scans instead
# of a dozen regex scans. ``tests/ingestion`` checks the literals against the rules.
RULE_LITERALS: dict[str, tuple[str, ...]] = {
    "tool_not_found": ("no such tool available", "unknown tool", "not found", "does not exist",
                       "is not a valid tool", "unsupported call", "unknown function", "unsupported tool"),
    "json_decode": ("jsondecodeerror", "invalid json", "failed to parse", "expecting value: line", " in json",
                    "could not parse "),
    "type_error": ("inputvalidationerror", "invalid_type", "required parameter ", "expected ", "invalid parameter",
                   "invalid argument"),
    "user_rejected": ("user doesn't want to proceed", "user rejected tool use", "rejected by "),
    "permission_denied": ("permission denied", "eacces", "operation not permitted", "requires approval",
                          "sandbox denied"),
    "timeout": ("timed out", "timeout"),
    "edit_mismatch": ("string to replace not found", " matches of the string", "old_string",
                      "apply_patch verification failed", "failed to "),
    "file_not_read": ("file has not been read yet", "read it first before"),
    "file_not_found": ("no such file or directory", "file does not exist", "enoent", "filenotfounderror",
                       "path does not exist"),
    "output_too_large": ("exceeds maximum allowed", "output too large", "exceeds the maximum"),
    "hook_blocked": ("hook error", "hook blocked", "hook denied", "pre-commit validation failed"),
    "interrupted": ("[request interrupted", "interrupted by user"),
}  # fmt: skip

# Literal prefix "xit" lets the regex engine skip ahead with a fast substring search.
_EXIT_RE = re.compile(r"xit(?:ed with code|ed with status| code:?)\s+(-?\d+)")


def exit_code_of(text: str, structured: Any = None) -> int | None:
    """The exit code reported by a shell tool, from structured fields first, else from the text."""
    if isinstance(structured, dict):
        for key in ("exit_code", "exitCode", "returnCode", "return_code"):
            v = structured.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        meta = structured.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("exit_code"), int):
            return meta["exit_code"]
    # _EXIT_RE starts with the literal "xit": a substring test skips the regex call when it cannot match
    # (one test over a text short enough to be all head and tail, no copies).
    if len(text) <= 6000 and "xit" not in text:
        return None
    head, tail = text[:4000], text[-2000:]
    m = (_EXIT_RE.search(head) if "xit" in head else None) or (
        _EXIT_RE.search(tail) if "xit" in tail else None
    )
    return int(m.group(1)) if m else None


def detect_failure(text: str, *, is_error_flag: bool, structured: Any = None) -> tuple[bool, int | None]:
    """Return ``(failed, exit_code)``.

    A result fails when the agent flagged it, when a shell reports a non-zero exit code, when the
    structured result says ``interrupted``, or when the text is Claude Code's ``<tool_use_error>``.
    """
    code = exit_code_of(text, structured)
    if is_error_flag:
        return True, code
    if code is not None and code != 0:
        return True, code
    if isinstance(structured, dict) and structured.get("interrupted") is True:
        return True, code
    if "<tool_use_error>" in text[:200]:
        return True, code
    return False, code


# Kinds that describe the tool *call* (no such tool, arguments not JSON, arguments not fitting the schema).
# When a command ran and reported an exit code, the call itself was fine: those words in its output are
# the program's own errors (a failed ``npm run build`` printing "TypeError", a traceback's JSONDecodeError).
CALL_KINDS = frozenset({"tool_not_found", "json_decode", "type_error"})


def classify_error(text: str, *, exit_code: int | None = None, denial: Any = None) -> str:
    """Map an error text to one of :data:`ERROR_KINDS` (never ``repeated_failure``: that needs history)."""
    if denial:
        return "permission_denied"
    head = text[:3000]
    low = head.lower()
    for kind, rx in _RULES:
        if exit_code is not None and kind in CALL_KINDS:
            continue
        if any(lit in low for lit in RULE_LITERALS[kind]) and rx.search(head):
            return kind
    if exit_code == 124:  # the exit status of timeout(1)
        return "timeout"
    return "runtime_error"


def clean_error_message(text: str, limit: int = 2000) -> str:
    """The error text without Claude Code's wrapper, cut to ``limit`` characters."""
    t = text.strip()
    if t.startswith("<tool_use_error>"):
        t = t[len("<tool_use_error>") :]
        if t.endswith("</tool_use_error>"):
            t = t[: -len("</tool_use_error>")]
    return t[:limit]
