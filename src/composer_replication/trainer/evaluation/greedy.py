"""Greedy answers of a saved model at held-out error states, and their scores (the pipeline's ``evaluate``).

**Recovery at held-out error sites.** For each state of the held-out traces that follows a failed tool call
(:func:`is_error_site`), the model gets the conversation so far exactly as training and GRPO render it
(the state's ``messages``, ``wire`` format, fitted to ``max_prompt_tokens`` by dropping the oldest
messages, never the system message: :func:`prompt_ids`) and answers greedily (:class:`GreedyGenerator`).
:func:`evaluate_sites` parses each answer with ``wire``: *valid* = it ended before ``max_new_tokens`` and
parses as a well-formed action (every tool line's input is JSON, and the tools named exist in the session
when the session lists its tools; an answer cut by the budget is no action, whatever it parses as); *tool
match* = the same sequence of tool names as the recorded recovery; *exact* = the same canonical action as
the recorded recovery (what the agent actually did next in the log). Held-out traces are never replayed
or trained on.

Greedy generations are cached in an append-only file (the pipeline's ``eval/generations.jsonl``) keyed by
the model's weight hash (:func:`model_fingerprint`), the site and the settings, so a rerun after a crash
(or after retraining only the GRPO phase) regenerates only what changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from composer_replication import wire
from composer_replication._io import JsonlAppender, hash_path, read_jsonl
from composer_replication.wire import score_action


def is_error_site(state: dict[str, Any]) -> bool:
    """True when a failed tool result follows the state's last assistant message (the agent must now
    recover): a ``tool`` message flagged ``is_error``, or a text-format result header saying so."""
    if state.get("error_kind"):
        return True
    msgs = state.get("messages") or []
    for m in reversed(msgs):
        if m.get("role") == "assistant":
            return False
        if m.get("role") == "tool" and m.get("is_error"):
            return True
        if m.get("role") == "user":  # messages in the text format: merged results, one per paragraph
            for part in str(m.get("content", "")).split(wire.ACTION_SEP):
                head = wire.parse_tool_result_head(part)
                if head is not None and head[1]:
                    return True
    return False


def model_fingerprint(model_dir: str | Path) -> str:
    """Hash of a model directory's weight and config files (the generation cache key)."""
    d = Path(model_dir)
    h = hashlib.sha256()
    for f in sorted(d.glob("*")):
        if f.is_file() and (f.suffix in (".safetensors", ".bin", ".json") or f.name.endswith(".model")):
            h.update(f.name.encode() + b"\0" + (hash_path(f) or "").encode())
    return h.hexdigest()[:16]


def prompt_ids(tok: Any, state: dict[str, Any], max_prompt_tokens: int) -> Any:
    """The ``(1, T)`` prompt ids a model answers at ``state``: its ``wire`` messages with the session's
    tool schemas (``wire.trace_tool_schemas``), fitted to ``max_prompt_tokens`` (oldest messages first,
    never the system message), with the generation prompt."""
    import torch

    tools = wire.trace_tool_schemas(state)
    msgs = wire.fit_messages(tok, state["messages"], max_prompt_tokens, tools)
    return torch.tensor([wire.render_ids(tok, msgs, tools)], dtype=torch.long)


class GreedyGenerator:
    """Greedy answers of a local model directory for chat states, with an append-only cache. A call
    returns ``(answer, complete)``: ``complete`` is False when the budget cut the answer.

    The answers come from the one generation engine (``generation.LocalEngine``, one state at a time:
    the tokens ``model.generate`` gives). ``engine``: any engine with ``complete(conversations, params)``
    instead, e.g. ``teacher_replay.endpoint.OpenAIEndpoint`` for the model served from ``model_dir``
    (``transformers serve``, vLLM); ``model_dir`` then gives the tokenizer that fits the prompts and the
    fingerprint that keys the cache."""

    def __init__(
        self,
        model_dir: str | Path,
        cache_path: Path,
        *,
        max_new_tokens: int,
        max_prompt_tokens: int,
        engine: Any = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.cache_path = cache_path
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.fingerprint = model_fingerprint(model_dir)
        self._engine: Any = engine
        self._tok: Any = None
        self.cache: dict[str, tuple[str, bool]] = {}
        if cache_path.exists():
            for rec in read_jsonl(cache_path):
                if "complete" in rec:  # rows written before completeness was recorded are generated again
                    self.cache[rec["key"]] = (rec["output"], bool(rec["complete"]))
        self.n_generated = 0

    def _key(self, state: dict[str, Any]) -> str:
        blob = json.dumps(
            [
                self.fingerprint,
                state["state_id"],
                state["messages"],
                wire.get_format(),
                wire.trace_tool_schemas(state),
                self.max_new_tokens,
                self.max_prompt_tokens,
            ]
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def _load(self) -> None:
        if self._engine is not None:
            from composer_replication.models import load_tokenizer

            self._tok = load_tokenizer(self.model_dir)
            return
        from composer_replication.generation.local import LocalEngine
        from composer_replication.models import load_model_and_tokenizer

        model, self._tok = load_model_and_tokenizer(self.model_dir)
        self._engine = LocalEngine(model.eval(), self._tok)

    def _answer(self, state: dict[str, Any]) -> tuple[str, bool]:
        from composer_replication.generation.local import LocalEngine, generate_params
        from composer_replication.generation.types import GenerationParams, action_text

        if self._tok is None:
            self._load()
        engine, tok, n = self._engine, self._tok, self.max_new_tokens
        if isinstance(engine, LocalEngine):  # the prompt ids exactly as evaluation renders them
            ids = prompt_ids(tok, state, self.max_prompt_tokens)[0].tolist()
            got = engine.generate([ids], generate_params(engine.model, max_new_tokens=n, temperature=0.0))[0]
        else:
            msgs = wire.fit_messages(tok, state["messages"], self.max_prompt_tokens)
            got = engine.complete([msgs], GenerationParams(max_new_tokens=n, temperature=0.0))[0]
        return action_text(got), got.complete

    def __call__(self, state: dict[str, Any]) -> tuple[str, bool]:
        key = self._key(state)
        if key in self.cache:
            return self.cache[key]
        text, complete = self._answer(state)
        with JsonlAppender(self.cache_path) as app:
            app.write({"key": key, "state_id": state["state_id"], "model": self.fingerprint, "output": text,
                       "complete": complete})  # fmt: skip
        self.cache[key] = (text, complete)
        self.n_generated += 1
        return text, complete


def evaluate_sites(
    generate: Callable[[dict[str, Any]], str | tuple[str, bool]],
    sites: Sequence[dict[str, Any]],
    *,
    stop: Callable[[], str | None] = lambda: None,
) -> dict[str, Any]:
    """Rates over ``sites`` plus the per-site rows (answer and scores). ``generate`` returns the answer,
    or ``(answer, complete)`` when it knows whether the token budget cut it (a cut answer is not valid)."""
    from tqdm import tqdm

    rows = []
    for st in tqdm(sites, desc="evaluate", unit="site", leave=False):
        reason = stop()
        if reason:
            from composer_replication.safety.kill_switch import KillSwitchTriggered

            raise KillSwitchTriggered(reason)
        got = generate(st)
        out, complete = got if isinstance(got, tuple) else (got, True)
        rows.append({"state_id": st["state_id"], "output": out, "complete": complete,
                     **score_action(out, st, complete=complete)})  # fmt: skip
    n = len(rows)

    def rate(k: str) -> float | None:
        return sum(r[k] for r in rows) / n if n else None

    return {
        "n_sites": n,
        "valid_rate": rate("valid"),
        "tool_call_rate": rate("has_tool_call"),
        "tool_match_rate": rate("tool_match"),
        "exact_match_rate": rate("exact"),
        "sites": rows,
    }
