"""The extra dataset columns ``ComposerReplicationTrainer`` reads, decoded, and the hint of each row.

Rows travel through TRL's dataset as Arrow columns, so a dict or list column may arrive as its JSON text
(``grpo.build.dataset_rows`` writes them so): :func:`decoded` and :func:`decoded_list` undo that.
:func:`row_hints` gives each row's hint for the SDPO teacher, the first of: the row's ``hint``; a hint a
reward function published for the row's completion (``last_hints``, as ``datagen.reward.make_shaped_reward``
does at the first failed tool call); the template for the row's ``error_kind`` (+ ``error_meta``); with
TRL tools, a failed tool call in the rollout, classified on the fly. :func:`first_pairs` marks the rows
whose preference pair counts in the batch (each pair once).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from composer_replication.trainer import pair_tokens


def hint_for(error_kind: str, meta: dict | None) -> str | None:
    """The hint template of ``error_kind`` filled from ``meta`` (``hint_generator.hint_for_error``)."""
    from composer_replication.hint_generator import hint_for_error

    return hint_for_error(error_kind, meta)


def decoded(value: Any) -> Any:
    """A dict column as given, or decoded from the JSON text it travels as (``grpo.build.dataset_rows``)."""
    return json.loads(value) if isinstance(value, str) and value[:1] == "{" else value


def decoded_list(value: Any) -> Any:
    """A list column (the row's tool schemas) as given, or decoded from its JSON text."""
    return json.loads(value) if isinstance(value, str) and value[:1] == "[" else value


def _failed_call_hint(completion: Any) -> str | None:
    """With TRL tools: the hint for the first tool call of the rollout that failed, if any."""
    if not isinstance(completion, list):
        return None
    for msg in completion:
        content = str(msg.get("content", ""))
        if msg.get("role") == "tool" and content.startswith("{'error':"):
            from composer_replication.ingestion.errors import classify_error

            meta = {"tool_name": msg.get("name"), "error_message": content}
            return hint_for(classify_error(content), meta)
    return None


def row_hints(
    inputs: list[dict], completions: Sequence[Any], reward_funcs: Sequence[Any]
) -> list[str | None]:
    """Each row's hint (module docstring), None where it has none. ``completions``: the rows' rollouts
    (TRL tools) or Nones; ``reward_funcs``: the trainer's reward functions (read for ``last_hints``)."""
    published: list[Any] = [None] * len(inputs)
    for f in reward_funcs:  # online: a reward that ran the completion names its failed call
        got = getattr(f, "last_hints", None)
        if isinstance(got, list) and len(got) == len(inputs):
            published = [p or q for p, q in zip(published, got)]
    hints: list[str | None] = []
    for row, completion, online in zip(inputs, completions, published):
        hint = row.get("hint") or online
        if not hint and row.get("error_kind"):
            hint = hint_for(row["error_kind"], decoded(row.get("error_meta")))
        if not hint:
            hint = _failed_call_hint(completion)
        hints.append(hint or None)
    return hints


def first_pairs(pairs: Sequence[Any]) -> list[bool]:
    """Per row: it carries a pair not seen earlier in the batch (a pair counts once per batch)."""
    seen: set[str] = set()
    first = []
    for p in pairs:
        pid = pair_tokens.pair_fields(p)[0] if p else None
        first.append(pid is not None and pid not in seen)
        if pid is not None:
            seen.add(pid)
    return first
