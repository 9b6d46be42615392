"""Which harness a rollout runs in: its tools (and their schemas for the system message), its log format,
and the per-task budget (turns, tokens, wall time) that ends a rollout with a recorded reason.

Harnesses:

- ``None`` (the default): the sandbox's four Claude Code tools ``Bash``, ``Read``, ``Write``, ``Edit``
  (``datagen.tools.TOOL_SCHEMAS``), without read-before-edit; a Claude Code session log.
- ``"claude_code"``: Claude Code's tool surface ``Bash``, ``Read``, ``Write``, ``Edit``, ``MultiEdit``,
  ``Grep``, ``Glob``, ``LS``, ``TodoWrite`` (`harness_claude`, `harness_search`), with read-before-edit;
  a Claude Code session log.
- ``"codex"``: ``shell``, ``apply_patch``, ``update_plan`` (`harness_codex`); a Codex rollout log
  (`codex_log`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from composer_replication.datagen.harness_base import ToolOutcome
from composer_replication.datagen.harness_claude import CLAUDE_TOOLS, SANDBOX_TOOLS, ClaudeCodeTools
from composer_replication.datagen.harness_codex import CODEX_TOOL_NAMES, CodexTools
from composer_replication.datagen.sandbox import Sandbox
from composer_replication.datagen.tools import TOOL_SCHEMAS
from composer_replication.tool_schemas import CLAUDE_CODE_TOOLS, CODEX_TOOLS

__all__ = [
    "END_REASONS",
    "HARNESSES",
    "Budget",
    "Toolset",
    "check_harness",
    "harness_schemas",
    "log_format",
    "make_toolset",
    "output_tokens",
]

HARNESSES = ("claude_code", "codex")
# Why a rollout ended: the model answered without a tool call, or a limit stopped it.
END_REASONS = ("done", "max_turns", "max_tokens", "max_wall_s")


class Toolset(Protocol):
    """One rollout's tools over one sandbox (`ClaudeCodeTools`, `CodexTools`)."""

    tools: tuple[str, ...]

    def call(self, name: str, args: Any, *, timeout: float = ...) -> ToolOutcome: ...


def check_harness(harness: str | None) -> str | None:
    """``harness`` unchanged, or one-line `ValueError` naming the choices."""
    if harness is not None and harness not in HARNESSES:
        raise ValueError(f"unknown harness {harness!r}; expected one of {', '.join(HARNESSES)} (or None)")
    return harness


def _names(harness: str | None) -> tuple[str, ...]:
    return {None: SANDBOX_TOOLS, "claude_code": CLAUDE_TOOLS, "codex": CODEX_TOOL_NAMES}[
        check_harness(harness)
    ]


def harness_schemas(harness: str | None) -> list[dict[str, Any]]:
    """The tool schemas the system message lists for ``harness`` (from ``tool_schemas``)."""
    if harness is None:
        return list(TOOL_SCHEMAS)
    table = CODEX_TOOLS if harness == "codex" else CLAUDE_CODE_TOOLS
    return [table[n] for n in _names(harness)]


def make_toolset(harness: str | None, sb: Sandbox) -> Toolset:
    """Fresh per-rollout tools for ``harness`` over the started sandbox ``sb``."""
    names = _names(harness)
    if harness == "codex":
        return CodexTools(sb, tools=names)
    return ClaudeCodeTools(sb, tools=names, require_read=harness == "claude_code")


def log_format(harness: str | None) -> str:
    """``"codex"`` or ``"claude_code"``: the session-log format a rollout in ``harness`` is written in."""
    return "codex" if check_harness(harness) == "codex" else "claude_code"


def output_tokens(policy: Any, text: str) -> int:
    """Tokens ``policy`` generated for ``text``: its ``last_usage["output_tokens"]`` when it reports one,
    else its ``tokenizer``'s count, else the ingestion's estimate (about 4 characters a token)."""
    usage = getattr(policy, "last_usage", None)
    if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
        return int(usage["output_tokens"])
    tok = getattr(policy, "tokenizer", None)
    if tok is not None and callable(getattr(tok, "encode", None)):
        return len(tok.encode(text, add_special_tokens=False))
    from composer_replication.ingestion._session import estimate_tokens

    return estimate_tokens(text)


@dataclass
class Budget:
    """A rollout's limits: ``max_turns`` model turns, ``max_tokens`` generated tokens (None: no cap),
    ``max_wall_s`` seconds from the first turn (None: no cap). `stop_reason` is checked before each
    model call; `tool_timeout` keeps a command inside the wall-clock budget."""

    max_turns: int = 8
    max_tokens: int | None = None
    max_wall_s: float | None = None
    turns: int = 0
    tokens: int = 0
    t0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens", "max_wall_s"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
                raise ValueError(f"{name} must be a positive number, got {v!r}")

    def spend(self, tokens: int) -> None:
        self.turns += 1
        self.tokens += tokens

    def stop_reason(self) -> str | None:
        if self.turns >= self.max_turns:
            return "max_turns"
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return "max_tokens"
        if self.max_wall_s is not None and time.monotonic() - self.t0 >= self.max_wall_s:
            return "max_wall_s"
        return None

    def tool_timeout(self, cap: float) -> float:
        if self.max_wall_s is None:
            return cap
        return max(min(cap, self.max_wall_s - (time.monotonic() - self.t0)), 0.001)
