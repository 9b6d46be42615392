"""The student-action text format and its canonical form: re-exported from :mod:`composer_replication.wire`.

``wire`` owns the format (one rendering of a trace for every path); these names stay importable here.
"""

from __future__ import annotations

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
    "canonical_action",
    "format_tool_use",
    "parse_action",
    "render_canonical",
]
