"""Data for the offline trainer: resumable example streams, held-out splits and batch building.

Two streams run side by side: traces (``TraceExample`` rows, collated by the ingestion engineer's
``ComposerDataCollator`` into the SFT and SDPO keys) and preference pairs (``DPOPair`` or
``NormalizedDPOPair`` rows, tokenised by ``pair_tokens``). Each stream's order is a pure function of
(seed, epoch), so its whole state is ``(epoch, position)``: a checkpoint stores that and a resumed run
sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import torch


class Stream:
    """Endless shuffled batches over ``items``; ``state_dict`` is ``{"epoch", "pos"}``."""

    def __init__(self, items: list[Any], batch_size: int, seed: int) -> None:
        if not items:
            raise ValueError("Stream needs at least one item")
        self.items, self.batch_size, self.seed = items, batch_size, seed
        self.epoch, self.pos = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        return torch.randperm(len(self.items), generator=g).tolist()

    def next_batch(self) -> list[Any]:
        out: list[Any] = []
        while len(out) < min(self.batch_size, len(self.items)):
            if self.pos >= len(self._perm):
                self.epoch, self.pos = self.epoch + 1, 0
                self._perm = self._permutation()
            out.append(self.items[self._perm[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._perm = self._permutation()


def is_held_out(key: str, fraction: float) -> bool:
    """Stable split by hash of an id (trace id for traces, pair id for pairs)."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def load_rows(path: str | Path | None) -> list[dict]:
    """Rows of a JSONL file; an ingest's references (traces.jsonl, states.jsonl) come back materialised."""
    if path is None:
        return []
    from composer_replication.ingestion.store import read_rows

    return list(read_rows(path))


def load_data(cfg: Any) -> tuple[list[dict], list[dict]]:
    """The rows of ``cfg.data.traces`` and ``cfg.data.pairs``, checked before anything is written:
    ``ValueError`` naming the file and the row when a row is not a trace (a ``turns`` list, as ``ingest``
    writes) or not a preference pair, or when the two files hold no row at all."""
    from composer_replication.trainer.pair_tokens import pair_fields

    traces, pairs = load_rows(cfg.data.traces), load_rows(cfg.data.pairs)
    for i, row in enumerate(traces, 1):
        if not isinstance(row, dict) or not isinstance(row.get("turns"), list):
            raise ValueError(
                f"{cfg.data.traces}: trace {i} has no `turns` list: data.traces takes the traces.jsonl "
                "that `composer-replication ingest` writes"
            )
    for i, row in enumerate(pairs, 1):
        try:
            pair_fields(row)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{cfg.data.pairs}: pair {i}: {exc} (data.pairs takes the pairs of `pairs` or `normalize`)"
            ) from None
    if not traces and not pairs:
        files = " and ".join(str(p) for p in (cfg.data.traces, cfg.data.pairs) if p is not None)
        raise ValueError(
            f"{files}: no rows to train on (an empty file?); run `composer-replication ingest` first"
        )
    return traces, pairs


def split(rows: list[dict], key_fn, fraction: float) -> tuple[list[dict], list[dict]]:
    train = [r for r in rows if not is_held_out(key_fn(r), fraction)]
    held = [r for r in rows if is_held_out(key_fn(r), fraction)]
    if not train and held:  # a tiny data set must still train on something
        train, held = held, []
    return train, held


def make_collator(
    tokenizer: Any, max_seq_len: int, max_dpo_seq_len: int, enable_sdpo: bool, whole_responses: bool = False
):
    from composer_replication.encoding import pad_id
    from composer_replication.hint_generator import hint_for_error
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator

    cfg = CollatorConfig(
        max_seq_len=max_seq_len,
        max_dpo_seq_len=max_dpo_seq_len,
        pad_token_id=pad_id(tokenizer),
        enable_sdpo=enable_sdpo,
        hint_generator=hint_for_error,
        enable_replay_dpo=False,  # pairs come from pairs.jsonl through their own stream
        whole_responses=whole_responses,
    )
    return ComposerDataCollator(tokenizer=tokenizer, config=cfg)


def trace_batch(collator, rows: list[dict]) -> dict[str, torch.Tensor]:
    batch = {
        k: v for k, v in collator([{**r, "dpo_pairs": None} for r in rows]).items() if torch.is_tensor(v)
    }
    if "sdpo_loss_mask" in batch:
        # Guard: a row whose masked span starts at position 0 has no logits predicting that token (the
        # collator keeps the response's header, so this only happens with a header-less template).
        # Such a row gets no SDPO term.
        bad = batch["sdpo_loss_mask"][:, 0].bool()
        if "sdpo_student_mask" in batch:
            bad |= batch["sdpo_student_mask"][:, 0].bool()
        if bool(bad.all()):
            for key in ("ctx_teacher_input_ids", "sdpo_loss_mask", "sdpo_student_mask"):
                batch.pop(key, None)
        elif bool(bad.any()):
            for key in ("sdpo_loss_mask", "sdpo_student_mask"):
                if key in batch:
                    batch[key] = batch[key].masked_fill(bad[:, None], 0)
    return batch


def recovery_pairs(
    traces: list[dict], *, limit_chars: int = 2000, at: Literal["failure", "recovery"] = "failure"
) -> list[dict]:
    """``DPOPair`` rows mined from the student's own recoveries, without teachers.

    At each tool error followed by an assistant turn, the action that failed is ``rejected`` and the
    recovery action is ``chosen``. ``at="failure"``: ``state_messages`` is the history before the failed
    action (prefer the recovery to the step that failed). ``at="recovery"``: it is the history through the
    error result, where the recovery was written (prefer the recovery to repeating the failed step). Useful
    to exercise the preference channel (tests, benchmarks, a run before any teacher replay); teacher
    consensus pairs from ``pairs`` are the real signal.
    """
    from composer_replication.wire import trace_messages, trace_tool_schemas

    if at not in ("failure", "recovery"):
        raise ValueError(f"recovery_pairs: at={at!r}; use 'failure' or 'recovery'")
    pairs: list[dict] = []
    seen: set[tuple] = set()
    for trace in traces:
        turns = trace.get("turns") or []
        for i, turn in enumerate(turns):
            if turn.get("role") != "tool" or turn.get("tool_error") is None:
                continue
            before = next((k for k in range(i - 1, -1, -1) if turns[k].get("role") == "assistant"), None)
            after = next((k for k in range(i + 1, len(turns)) if turns[k].get("role") == "assistant"), None)
            if before is None or after is None:
                continue
            rejected = str(turns[before].get("content") or "")[:limit_chars]
            chosen = str(turns[after].get("content") or "")[:limit_chars]
            if not chosen.strip() or chosen == rejected:
                continue
            # at="failure": a failed action that opens the window leaves no state to prefer it in
            if at == "failure" and before == 0:
                continue
            messages, _ = trace_messages(trace, before if at == "failure" else after)
            key = (json.dumps(messages[-2:], sort_keys=True), chosen, rejected)
            if key in seen:  # overlapping trace windows repeat the same site
                continue
            seen.add(key)
            pairs.append(
                {
                    "state_id": f"{trace.get('trace_id')}::{before if at == 'failure' else after}",
                    "state_messages": messages,
                    "chosen": chosen,
                    "rejected": rejected,
                    "n_teachers_agreeing": 0,
                    "tools": trace_tool_schemas(trace),  # the session's schemas, rendered with the state
                }
            )
    return pairs
