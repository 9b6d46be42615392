"""``train_grpo(config, out_dir=...)``: the ``grpo`` mode of the ``train`` command, over TRL.

Prompts come from the ingested data: each preference pair's ``state_messages`` (the row also carries
the pair, so the DPO channel trains on it) and each tool-error site of a trace (the row carries
``error_kind``/``error_meta``, so the SDPO teacher is the same model given the hint). Rewards
(``grpo.reward.type``):

- ``teacher_match``: 1.0 when the completion's canonical action equals the row's reference action (the
  teachers' consensus for pair rows, the student's own recovery for error-site rows), else half the
  ``difflib`` similarity of the two action texts;
- ``tool_format``: 1.0 when the completion parses as at least one tool call (``wire``), else 0.

With ``grpo.tasks`` (a task directory or bundled task names) the prompts are those tasks and the reward
is the shaped sandbox reward instead (``trainer.grpo.tasks``); the pairs of ``data.pairs`` ride along.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from composer_replication import wire
from composer_replication.config import TrainConfig
from composer_replication.trainer import data as od
from composer_replication.trainer import pair_tokens


def build_rows(traces: list[dict], pairs: list[dict]) -> list[dict]:
    """Dataset rows for TRL: ``prompt``, ``reference`` and optionally ``dpo_pair`` / ``error_kind``.

    Trace rows are rendered with ``wire.trace_messages`` (the system message, the history up to the
    recovery turn) and carry the trace's ``tools`` (``wire.trace_tool_schemas``): token for token what
    evaluation shows the model at the same state. Pair rows carry the pair's ``tools`` when it has them.
    Each recovery (``state_id`` of the assistant turn) gives one row, from its ``error_site`` example when
    the traces have kinds (an episode repeats the same site).
    """
    rows = []
    for pair in pairs:
        _, messages, chosen, _ = pair_tokens.pair_fields(pair)
        rows.append({"prompt": messages, "reference": chosen, "dpo_pair": pair, "tools": pair.get("tools")})
    kinds = {t.get("kind") for t in traces}
    if "error_site" in kinds:
        traces = sorted(traces, key=lambda t: t.get("kind") != "error_site")  # error_site examples first
    seen: set[str] = set()
    for trace in traces:
        turns = trace.get("turns") or []
        for i, turn in enumerate(turns):
            if turn.get("role") != "tool" or not turn.get("tool_error"):
                continue
            j = next((k for k in range(i + 1, len(turns)) if turns[k].get("role") == "assistant"), None)
            if j is None or not turns[j].get("content"):
                continue
            key = turns[j].get("state_id") or f"{trace.get('trace_id')}#{trace.get('example_id')}#{j}"
            if key in seen:
                continue
            seen.add(key)
            meta = dict(turn.get("error_meta") or {})
            rows.append(
                {
                    "prompt": wire.trace_messages(trace, j)[0],
                    "tools": wire.trace_tool_schemas(trace),
                    "reference": str(turns[j]["content"]),
                    "state_id": turns[j].get("state_id"),
                    "error_kind": meta.get("error_kind") or "runtime_error",
                    "error_meta": meta,
                }
            )
    return rows


def fit_prompt(tok: Any, messages: list[dict], max_len: int, tools: list[dict] | None = None) -> list[dict]:
    """``wire.fit_messages``: drop the oldest messages (the system message stays) until the prompt fits."""
    return wire.fit_messages(tok, messages, max_len, tools)


def _completion_text(c: Any) -> str:
    """A completion as text (a parsed assistant message's ``tool_calls`` as the project's action text)."""
    if not isinstance(c, list):
        return str(c)
    msg = c[-1]
    if msg.get("tool_calls"):
        parsed = wire.parse_openai_message(msg)
        return wire.action_text(parsed.text, parsed.tool_calls)
    return str(msg.get("content") or "")


def teacher_match_reward(completions: list, reference: list[str], **_: Any) -> list[float]:
    canonical_action = wire.canonical_action
    out = []
    for c, ref in zip(completions, reference):
        text = _completion_text(c)
        if canonical_action(text) is not None and canonical_action(text) == canonical_action(ref):
            out.append(1.0)
        else:
            out.append(0.5 * difflib.SequenceMatcher(None, text, ref).ratio())
    return out


def tool_format_reward(completions: list, **_: Any) -> list[float]:
    return [1.0 if wire.parse_action(_completion_text(c)).tool_calls else 0.0 for c in completions]


def train_grpo(
    cfg: TrainConfig,
    *,
    out_dir: str | Path,
    resume: bool = False,
    stop: Any | None = None,
    merge: bool = False,
) -> dict[str, float]:
    """Run ``ComposerReplicationTrainer`` per ``cfg`` (``trainer.grpo.build``), export ``out_dir/final``
    (``trainer.export``; ``merge``: LoRA merged into the weights) and return TRL's last logged metrics.
    Raises ``ConfigError`` naming any field grpo mode cannot honour."""
    from composer_replication.trainer.grpo.build import check_grpo_config
    from composer_replication.trainer.grpo.scale import preflight

    check_grpo_config(cfg)  # before any model loads
    preflight(cfg)
    with wire.use_format(cfg.data.wire_format):
        if cfg.grpo.tasks is not None:  # sandbox tasks, the shaped reward (trainer.grpo.tasks)
            from composer_replication.trainer.grpo.tasks import train_tasks_mode

            return train_tasks_mode(cfg, Path(out_dir), resume=resume, stop=stop, merge=merge)
        return _train_grpo(cfg, Path(out_dir), resume=resume, stop=stop, merge=merge)


def _train_grpo(cfg: TrainConfig, out: Path, *, resume: bool, stop: Any, merge: bool) -> dict[str, float]:
    from composer_replication.trainer.export import base_dir
    from composer_replication.trainer.grpo.build import build_grpo_trainer, run_grpo

    rows = build_rows(*od.load_data(cfg))  # a bad or empty file fails here, before out_dir is created
    if not rows:
        raise ValueError(
            "grpo mode found no prompts: data.pairs has no pairs and data.traces no tool-error sites"
        )
    out.mkdir(parents=True, exist_ok=True)
    reward = teacher_match_reward if cfg.grpo.reward.type == "teacher_match" else tool_format_reward
    trainer, callbacks = build_grpo_trainer(cfg, rows, reward, out, stop=stop)
    return run_grpo(trainer, callbacks, out, resume=resume, plot=cfg.logging.plot, final_dir=out / "final",
                    merge=merge, base_dir=base_dir(cfg))  # fmt: skip
