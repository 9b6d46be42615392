"""On-policy self-distillation at tool-error sites (OPSD, arXiv 2601.18734, as the idea intends).

At an error site of a training trace the student samples its own continuation of the conversation (no
hint, no gradient); the same model given the hint scores those sampled tokens as the teacher (under
``no_grad``, inside ``loss.sdpo_channel``), and the generalized JSD (or the TAID / EOPD wrappers) pulls
the student towards what it would do with the hint. The teacher's prompt is the student's plus the hint
(:func:`site_prompts`), and with ``on_policy.privileged: recovery`` (the default) the hint also carries
the recorded recovery (``wire.with_solution``): OPSD's privileged solution. With ``source: recorded`` the teacher scores the
recorded agent's recovery instead: tokens the student never produced, which is why that variant barely
moves a small model (``notes/learning.md``).

Samples are decoded by the one generation engine (``generation.engine.sample``: one batch, KV cache)
and come from a private ``torch.Generator`` seeded by (seed, step, micro-batch), never from the global
RNG, and are cached by (seed, step, micro-batch, site): in memory, and in an append-only JSONL file when
the trainer has an output folder. A resumed run therefore uses exactly the samples the interrupted run
drew, even where regenerating them would not be bit-identical (GPU kernels).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from composer_replication import encoding, wire
from composer_replication.generation.engine import eos_token_ids, sample
from composer_replication.trainer.error_sites import ErrorSite, site_prompts


def sdpo_batch(
    student_prompts: Sequence[list[int]],
    teacher_prompts: Sequence[list[int]],
    samples: Sequence[list[int]],
    pad_id: int,
) -> dict[str, torch.Tensor] | None:
    """Right-padded student rows (prompt + sample) and teacher rows (hinted prompt + the same sample),
    with masks selecting the sampled tokens in each; rows with an empty sample are left out."""
    rows = [(s, t, x) for s, t, x in zip(student_prompts, teacher_prompts, samples, strict=True) if x]
    if not rows:
        return None
    s_ids, s_mask, s_attn = encoding.stack_prompt_response([(s, x) for s, _, x in rows], pad_id)
    t_ids, t_mask, t_attn = encoding.stack_prompt_response([(t, x) for _, t, x in rows], pad_id)
    return {
        "input_ids": s_ids,
        "attention_mask": s_attn,
        "sdpo_student_mask": s_mask,
        "ctx_teacher_input_ids": t_ids,
        "ctx_teacher_attention_mask": t_attn,
        "sdpo_loss_mask": t_mask,
    }


class SampleCache:
    """Samples keyed by ``"seed:step:micro:site_id"``; mirrored to an append-only JSONL file if given."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.samples: dict[str, list[int]] = {}
        if path is not None and path.exists():
            from composer_replication._io import read_jsonl

            for rec in read_jsonl(path):
                self.samples[rec["key"]] = list(rec["tokens"])

    def put(self, items: dict[str, list[int]]) -> None:
        self.samples.update(items)
        if self.path is not None and items:
            from composer_replication._io import JsonlAppender

            with JsonlAppender(self.path) as app:
                for key, tokens in items.items():
                    app.write({"key": key, "tokens": tokens})


class OnPolicySDPO:
    """Draws the student's samples at error sites and builds the on-policy SDPO batch for one micro-batch."""

    def __init__(
        self, tok: Any, sites: list[ErrorSite], cfg: Any, seed: int, cache_path: Path | None = None
    ) -> None:
        from composer_replication.trainer.data import Stream

        if not sites:
            raise ValueError(
                "loss.sdpo.source=on_policy needs error sites with a hint in the training traces; "
                "none found (use source: recorded, or traces with failed tool calls)"
            )
        self.tok, self.cfg, self.seed = tok, cfg, seed
        op = cfg.loss.sdpo.on_policy
        if op.privileged == "recovery":  # OPSD: the teacher also sees the solution (the recorded recovery)
            sites = [replace(s, hint=wire.with_solution(s.hint or "", s.recovery)) for s in sites]
        self.max_new, self.temperature = op.max_new_tokens, op.temperature
        self.max_prompt = max(8, cfg.data.max_seq_len - op.max_new_tokens)
        self.stream = Stream(sites, op.sites_per_batch, seed + 2)
        self.cache = SampleCache(cache_path)
        self.eos = eos_token_ids(tok)
        self.pad = encoding.pad_id(tok)

    def batch(self, model: Any, step: int, micro: int) -> tuple[dict[str, torch.Tensor] | None, dict]:
        """The SDPO inputs for micro-batch ``micro`` of optimizer step ``step`` (0-based), plus metrics."""
        sites = self.stream.next_batch()
        both = [site_prompts(self.tok, s, self.max_prompt) for s in sites]
        s_prompts = [p for p, _ in both]
        t_prompts = [t for _, t in both if t is not None]
        if len(t_prompts) != len(s_prompts):
            raise ValueError("an on-policy SDPO site has no hint (error_sites keeps only hinted sites)")
        keys = [f"{self.seed}:{step}:{micro}:{s.site_id}" for s in sites]
        missing = [i for i, k in enumerate(keys) if k not in self.cache.samples]
        if missing:
            g = torch.Generator().manual_seed(_mix(self.seed, step, micro))
            drawn = sample(
                model, [s_prompts[i] for i in missing], max_new_tokens=self.max_new,
                temperature=self.temperature, eos_ids=self.eos, pad_id=self.pad, generator=g,
            )  # fmt: skip
            self.cache.put({keys[i]: d for i, d in zip(missing, drawn, strict=True)})
        samples = [self.cache.samples[k] for k in keys]
        lengths = [len(x) for x in samples]
        metrics = {"sdpo/sample_tokens": sum(lengths) / max(1, len(lengths)), "sdpo/sites": float(len(sites))}
        return sdpo_batch(s_prompts, t_prompts, samples, self.pad), metrics

    def state_dict(self) -> dict[str, int]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.stream.load_state_dict(state)


def _mix(*parts: int) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big") >> 1
