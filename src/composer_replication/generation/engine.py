"""The decoding loop: a batch of token-id prompts run once with a KV cache, then continued token by token.

One loop serves every in-process caller (on-policy SDPO samples, site evaluation, pipeline evaluation,
sandbox rollouts, the in-process teacher; :class:`~composer_replication.generation.local.LocalEngine`
wraps it for chat messages). What it keeps from the code it replaced, and why:

- **One prefill, then one token per step** through the model's KV cache; the prefill asks for the last
  position's logits only (``logits_to_keep=1``), so a long prompt costs no ``(T, vocab)`` logits tensor.
- **A KV buffer allocated once** (:mod:`.kv_buffer`): each step writes its keys and values in place
  instead of ``torch.cat`` of the whole cache.
- **Finished rows leave the batch** (greedy decoding): cache, mask and positions are cut to the live
  rows, so the tail of one long answer costs what its few rows cost. Sampled decoding keeps every row,
  so each row's draws are what they were with the whole batch (the draws of one step are one
  ``torch.multinomial`` over the batch).
- **The prefill is a separate call** (:func:`prefill`): a caller can score continuations from a copy of
  its cache (:func:`continuation_logits`) and decode from the same cache, and can wrap it in
  ``trainer.evaluation.frozen_prefix``'s replay of shared decoder layers.

Sampling follows ``transformers``' ``generate`` step for step (float32 logits, repetition penalty,
temperature, top-k, top-p, softmax, one ``torch.multinomial``), so a single prompt decodes to the tokens
``generate`` gives with the same settings and RNG state (tested).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from composer_replication import encoding

__all__ = [
    "Decoded",
    "Prefill",
    "continuation_logits",
    "decode",
    "decode_rows",
    "eos_token_ids",
    "prefill",
    "sample",
]


@dataclass
class Prefill:
    """A left-padded batch of prompts run once with a KV cache: the next-token logits of every prompt,
    the cache, the attention mask and the last position ids (what decoding and scoring continue from)."""

    logits: torch.Tensor  # (B, V) float32, predicting each prompt's next token
    cache: Any
    attn: torch.Tensor  # (B, P)
    pos: torch.Tensor  # (B, 1) position id of each prompt's last token


@torch.no_grad()
def prefill(model: Any, prompts: Sequence[Sequence[int]], pad_id: int) -> Prefill:
    """Run ``prompts`` (left-padded into one batch) through ``model`` once, keeping the KV cache."""
    dev = next(model.parameters()).device
    ids = encoding.pad_rows(prompts, pad_id, left=True).to(dev)
    attn = encoding.pad_rows([[1] * len(p) for p in prompts], 0, left=True).to(dev)
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
    return Prefill(out.logits[:, -1].float(), out.cache, attn, pos[:, -1:])


@torch.no_grad()
def continuation_logits(
    model: Any, pre: Prefill, conts: Sequence[Sequence[int]], pad_id: int
) -> torch.Tensor:
    """``(B, R, V)`` float32 logits predicting each continuation's tokens after its prompt (teacher
    forcing from a copy of ``pre``'s cache; ``R`` = the longest continuation, rows right-padded)."""
    dev = pre.attn.device
    width = max(len(c) for c in conts)
    if width <= 1:
        return pre.logits[:, None]
    ids = torch.full((len(conts), width - 1), pad_id, dtype=torch.long)
    mask = torch.zeros((len(conts), width - 1), dtype=torch.long)
    for i, c in enumerate(conts):  # the last token of a continuation predicts nothing we score
        body = list(c)[:-1]
        if body:
            ids[i, : len(body)] = torch.tensor(body, dtype=torch.long)
            mask[i, : len(body)] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    pos = pre.pos + torch.arange(1, width, device=dev)[None]
    out = model(
        input_ids=ids,
        attention_mask=torch.cat([pre.attn, mask], -1),
        position_ids=pos,
        cache=copy.deepcopy(pre.cache),
        use_cache=True,
    )
    return torch.cat([pre.logits[:, None], out.logits.float()], 1)


def eos_token_ids(tok: Any) -> list[int]:
    """The ids that end an assistant turn: the tokenizer's EOS plus the chat template's end-of-turn token."""
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    for name in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tok.convert_tokens_to_ids(name) if name in tok.get_vocab() else None
        if tid is not None:
            ids.add(tid)
    return sorted(ids)


@dataclass
class Decoded:
    """Per row: the new token ids, their log-probabilities (if asked) and whether the row ended (an
    end-of-turn token or a stop) rather than ran out of ``max_new_tokens``."""

    ids: list[list[int]]
    logprobs: list[list[float]] | None
    ended: list[bool]


def _penalize(logits: torch.Tensor, rows: list[int], seen: list[list[int]], penalty: float) -> torch.Tensor:
    """``generate``'s repetition penalty: each token already in row ``rows[b]``'s context is divided by
    ``penalty`` (multiplied where negative)."""
    logits = logits.clone()
    for b, i in enumerate(rows):
        idx = torch.tensor(seen[i], dtype=torch.long, device=logits.device)
        score = logits[b, idx]
        logits[b, idx] = torch.where(score < 0, score * penalty, score / penalty)
    return logits


def _warp(scores: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as ``generate``'s logits warpers compute them."""
    if temperature != 1.0:
        scores = scores / temperature
    if top_k:
        kth = torch.topk(scores, min(top_k, scores.shape[-1]))[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(scores, descending=False)
        drop = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        drop[..., -1:] = False  # the most likely token always stays
        scores = scores.masked_fill(drop.scatter(1, order, drop), -float("inf"))
    return scores


@torch.no_grad()
def decode_rows(
    model: Any,
    pre: Prefill,
    *,
    max_new_tokens: int,
    eos_ids: Sequence[int],
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    context: Sequence[Sequence[int]] | None = None,
    stop: Callable[[list[int]], bool] | None = None,
    logprobs: bool = False,
) -> Decoded:
    """Continue every prompt of ``pre`` (its cache is consumed): up to ``max_new_tokens`` each, ending
    at an EOS id (kept) or where ``stop(row_ids)`` says so. ``temperature == 0`` is greedy; otherwise
    tokens are drawn after ``_warp`` with ``generator`` on its device (``None``: the global RNG of the
    logits' device). ``context`` (each row's prompt ids) is needed for ``repetition_penalty != 1``."""
    from composer_replication.generation.kv_buffer import buffer_cache

    dev = pre.attn.device
    eos = set(int(e) for e in eos_ids)
    n = pre.logits.shape[0]
    greedy = temperature == 0
    if repetition_penalty != 1.0 and context is None:
        raise ValueError("repetition_penalty needs each row's prompt ids (context=)")
    seen = [list(c) for c in context] if context is not None and repetition_penalty != 1.0 else None
    # the cache gets room for the answer up front: no torch.cat of the whole cache per step
    logits, cache, attn, pos = pre.logits, buffer_cache(pre.cache, max_new_tokens), pre.attn, pre.pos
    rows = list(range(n))  # batch row b holds prompt rows[b]
    done = [False] * n
    seqs: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    for step in range(max_new_tokens):
        scores = _penalize(logits, rows, seen, repetition_penalty) if seen is not None else logits
        if greedy:
            nxt = scores.argmax(-1)
        else:
            probs = torch.softmax(_warp(scores, temperature, top_k, top_p), -1)
            if generator is not None:
                probs = probs.to(generator.device)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(dev)
        picked = (
            torch.log_softmax(logits, -1).gather(-1, nxt[:, None]).squeeze(-1).tolist() if logprobs else None
        )
        for b, (i, tok_id) in enumerate(zip(rows, nxt.tolist(), strict=True)):
            if done[i]:
                continue
            seqs[i].append(tok_id)
            if picked is not None:
                lps[i].append(picked[b])
            if seen is not None:
                seen[i].append(tok_id)
            done[i] = tok_id in eos or (stop is not None and stop(seqs[i]))
        if all(done) or step == max_new_tokens - 1:
            break
        if greedy and any(done[i] for i in rows):
            keep = [b for b, i in enumerate(rows) if not done[i]]
            idx = torch.tensor(keep, device=dev)
            rows, nxt, attn, pos = [rows[b] for b in keep], nxt[idx], attn[idx], pos[idx]
            cache.batch_select_indices(idx)
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], -1)
        pos = pos + 1
        out = model(
            input_ids=nxt[:, None], attention_mask=attn, position_ids=pos, cache=cache, use_cache=True
        )
        logits, cache = out.logits[:, -1].float(), out.cache
    return Decoded(seqs, lps if logprobs else None, done)


def decode(
    model: Any,
    pre: Prefill,
    *,
    max_new_tokens: int,
    temperature: float,
    eos_ids: Sequence[int],
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """The new token ids of :func:`decode_rows` (``temperature`` only: no filtering, no penalty)."""
    return decode_rows(
        model,
        pre,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        temperature=temperature,
        generator=generator,
    ).ids


def sample(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    eos_ids: Sequence[int],
    pad_id: int,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Continuations of ``prompts`` (left-padded into one batch, KV cache): :func:`prefill`, then
    :func:`decode`, in eval mode."""
    if not prompts:
        return []
    was_training = model.training
    model.eval()
    try:
        pre = prefill(model, prompts, pad_id)
        return decode(model, pre, max_new_tokens=max_new_tokens, temperature=temperature, eos_ids=eos_ids,
                      generator=generator)  # fmt: skip
    finally:
        model.train(was_training)
