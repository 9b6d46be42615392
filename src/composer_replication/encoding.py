"""Token ids for the loss seam: a prompt through the chat template, a response after it, padded batches.

The one place that pads: every ``(B, T)`` tensor of ids or masks built from ragged rows goes through
`pad_rows` (right padding unless ``left``), with the tokenizer's pad id from `pad_id`. Prompts are
rendered with the chat template and a generation prompt, then tokenised without special tokens; a
response is its text plus the end-of-turn token, masked 1 (`encode_response`).

The collator (``trainer.data_collator``) renders whole traces message by message, for exact masks over
many turns; it pads through `pad_rows` too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["encode_response", "pad_id", "pad_rows", "render_prompt_ids", "stack_prompt_response"]


def pad_id(tokenizer: Any) -> int:
    """The id to pad with: the pad token, else end-of-sequence, else 0."""
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if value is not None:
            return int(value)
    return 0


def pad_rows(
    rows: Sequence[Sequence[int]], value: int, *, left: bool = False, length: int | None = None
) -> torch.Tensor:
    """Ragged rows as one ``(B, T)`` long tensor, ``T = length`` or the longest row (at least 1)."""
    width = length if length is not None else max(max((len(r) for r in rows), default=0), 1)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            if left:
                out[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            else:
                out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def render_prompt_ids(
    tokenizer: Any, messages: list[dict] | str, tools: Sequence[Any] | None = None
) -> list[int]:
    """Chat-template ``messages`` with the session's ``tools`` (``wire.render_ids``: the generation
    prompt, the active wire format) into token ids; plain text passes through."""
    if isinstance(messages, str):
        return list(tokenizer(messages, add_special_tokens=False)["input_ids"])
    from composer_replication import wire

    return wire.render_ids(tokenizer, messages, tools)


def encode_response(
    tokenizer: Any, prompt_ids: list[int], response: str, max_len: int
) -> tuple[list[int], list[int]]:
    """``prompt + response + eos`` ids (the prompt cut from the left to fit ``max_len``) and a mask that
    is 1 on the response (and eos) tokens."""
    eos = tokenizer.eos_token or ""
    resp = list(tokenizer(response + eos, add_special_tokens=False)["input_ids"])[:max_len]
    keep = max(0, max_len - len(resp))
    prompt = prompt_ids[-keep:] if keep else []
    return prompt + resp, [0] * len(prompt) + [1] * len(resp)


def stack_prompt_response(
    seqs: Sequence[tuple[list[int], list[int]]], pad: int, *, length: int | None = None, left: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, response mask, attention mask) for ``[(prompt_ids, response_ids), ...]``."""
    ids = pad_rows([p + r for p, r in seqs], pad, left=left, length=length)
    resp = pad_rows([[0] * len(p) + [1] * len(r) for p, r in seqs], 0, left=left, length=length)
    attn = pad_rows([[1] * (len(p) + len(r)) for p, r in seqs], 0, left=left, length=length)
    return ids, resp, attn
