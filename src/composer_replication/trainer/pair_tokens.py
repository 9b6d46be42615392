"""Tokenise preference pairs (``DPOPair`` or ``NormalizedDPOPair``) into chosen/rejected id tensors.

Both row shapes are accepted, as dicts or as dataclasses: ``DPOPair`` carries ``chosen`` / ``rejected``
strings; ``NormalizedDPOPair`` carries ``chosen_messages`` / ``rejected_messages`` chat lists. The prompt
is ``state_messages`` rendered with the tokenizer's chat template, the pair's ``tools`` (when it carries
them) and a generation prompt; the response is the action as the model writes it in the active wire
format (``wire.response_text``: native tool calls, or the text format's action text) followed by the
end-of-turn token. Long prompts are cut from the left (the most
recent context is kept), so the response itself is never truncated unless it alone is over the cap.

:func:`reference_logprobs` scores the pairs once with the reference weights (the initial ones, adapters
disabled); :func:`pair_batch` turns pairs and those scores into the preference channel's inputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import torch

from composer_replication import wire
from composer_replication.encoding import encode_response, pad_id, pad_rows, render_prompt_ids

__all__ = ["encode_pairs", "pair_batch", "pair_fields", "reference_logprobs"]


def pair_fields(pair: Any) -> tuple[str, list[dict], str, str]:
    """Return ``(pair_id, state_messages, chosen_text, rejected_text)`` for either pair shape."""
    is_record = dataclasses.is_dataclass(pair) and not isinstance(pair, type)
    row = dataclasses.asdict(pair) if is_record else dict(pair)
    messages = row.get("state_messages")
    if not isinstance(messages, list):
        raise ValueError(f"pair {row.get('state_id')!r} has no state_messages list")
    # ``is not None``: a datasets/Arrow column mixing both shapes fills the other shape's keys with None.
    if row.get("chosen") is not None and row.get("rejected") is not None:
        chosen, rejected = row["chosen"], row["rejected"]
    elif row.get("chosen_messages") is not None and row.get("rejected_messages") is not None:
        chosen = "\n\n".join(str(m.get("content", "")) for m in row["chosen_messages"])
        rejected = "\n\n".join(str(m.get("content", "")) for m in row["rejected_messages"])
    else:
        raise ValueError(
            f"pair {row.get('state_id')!r} has neither chosen/rejected (DPOPair) nor "
            "chosen_messages/rejected_messages (NormalizedDPOPair)"
        )
    # state_id alone is not unique (several pairs per state are possible): key by content too.
    digest = hashlib.sha1(f"{chosen}\x00{rejected}".encode()).hexdigest()[:12]
    pair_id = str(row.get("pair_id") or f"{row.get('state_id')}#{digest}")
    return pair_id, messages, str(chosen), str(rejected)


def pair_tools(pair: Any) -> list[dict] | None:
    """The tool schemas a pair's state is shown with (``tools``; a ``NormalizedDPOPair`` keeps them in
    its ``metadata``), or None."""
    row = pair if isinstance(pair, dict) else {"metadata": getattr(pair, "metadata", None)}
    tools = row.get("tools") or (row.get("metadata") or {}).get("tools")
    return list(tools) if isinstance(tools, list) else None


def encode_pairs(tokenizer: Any, pairs: list[Any], max_len: int = 2048) -> dict[str, Any]:
    """Batch of pairs -> the loss seam's ``dpo_*`` keys (right-padded) plus ``pair_ids`` (a list)."""
    pad = pad_id(tokenizer)
    ids: dict[str, list[list[int]]] = {"chosen": [], "rejected": []}
    masks: dict[str, list[list[int]]] = {"chosen": [], "rejected": []}
    pair_ids = []
    for pair in pairs:
        pid, messages, chosen, rejected = pair_fields(pair)
        tools = pair_tools(pair)
        prompt = render_prompt_ids(tokenizer, messages, tools)
        for side, text in (("chosen", chosen), ("rejected", rejected)):
            i, m = encode_response(tokenizer, prompt, wire.response_text(tokenizer, text, tools), max_len)
            ids[side].append(i)
            masks[side].append(m)
        pair_ids.append(pid)
    out: dict[str, Any] = {"pair_ids": pair_ids}
    for side in ("chosen", "rejected"):
        out[f"dpo_{side}_input_ids"] = pad_rows(ids[side], pad)
        out[f"dpo_{side}_response_mask"] = pad_rows(masks[side], 0)
    return out


@torch.no_grad()
def reference_logprobs(model, tok, pairs: list[dict], max_len: int, batch_size: int = 4) -> dict[str, tuple]:
    """Summed reference log-probs per pair id, with the current (initial) weights; adapters disabled."""
    from contextlib import nullcontext

    from composer_replication.loss import sequence_logprobs

    out: dict[str, tuple[float, float]] = {}
    ctx = model.disable_adapter() if hasattr(model, "peft_config") else nullcontext()
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    with ctx:
        for i in range(0, len(pairs), batch_size):
            enc = encode_pairs(tok, pairs[i : i + batch_size], max_len)
            c = sequence_logprobs(
                model, enc["dpo_chosen_input_ids"].to(dev), enc["dpo_chosen_response_mask"].to(dev)
            )
            r = sequence_logprobs(
                model, enc["dpo_rejected_input_ids"].to(dev), enc["dpo_rejected_response_mask"].to(dev)
            )
            for pid, a, b in zip(enc["pair_ids"], c.tolist(), r.tolist()):
                out[pid] = (a, b)
    model.train(was_training)
    return out


def pair_batch(tok, rows: list[dict], ref: dict[str, tuple], max_len: int, device) -> dict[str, torch.Tensor]:
    """The preference channel's inputs for ``rows``: their tokens and their cached reference log-probs."""
    enc = encode_pairs(tok, rows, max_len)
    vals = torch.tensor([ref[p] for p in enc.pop("pair_ids")], dtype=torch.float32)
    enc["dpo_chosen_ref_logprobs"], enc["dpo_rejected_ref_logprobs"] = vals[:, 0], vals[:, 1]
    return {k: v.to(device) for k, v in enc.items()}
