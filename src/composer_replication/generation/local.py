"""The in-process engine: a transformers causal LM and its tokenizer behind one ``complete`` call.

:class:`LocalEngine` renders chat messages to prompt ids (the ``encoding`` rendering every other path
uses, unless given its own ``render``), decodes them in batches with :mod:`.engine`'s loop and returns
:class:`~composer_replication.generation.types.Completion` records: token ids, text, finish reason and,
when asked, per-token log-probabilities. Parsing the text into tool calls is not its business:
:func:`~composer_replication.generation.types.tool_calls` reads it through ``wire``, the same way for an
endpoint's answers.

:func:`generate_params` gives the settings under which a prompt decodes to what ``model.generate`` gives
for it: the model's generation config fills what the caller leaves open, with ``generate``'s defaults
(top-k 50 when sampling), and :func:`stop_token_ids` adds the config's end-of-sequence ids to the
template's end-of-turn tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from composer_replication import encoding

from .types import Completion, GenerationParams

__all__ = ["LocalEngine", "generate_params", "stop_token_ids"]

log = logging.getLogger(__name__)

# generation-config fields whose logits processors this engine does not apply (left at their defaults)
_UNSUPPORTED = {"min_p": None, "typical_p": 1.0, "no_repeat_ngram_size": 0, "epsilon_cutoff": 0.0,
                "eta_cutoff": 0.0, "top_h": None, "min_new_tokens": None, "bad_words_ids": None,
                "suppress_tokens": None, "begin_suppress_tokens": None}  # fmt: skip


def stop_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The template's end-of-turn ids (``engine.eos_token_ids``) plus the generation config's EOS ids
    (where ``generate`` stops)."""
    from .engine import eos_token_ids

    ids = set(eos_token_ids(tokenizer))
    cfg_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update([cfg_eos] if isinstance(cfg_eos, int) else list(cfg_eos or []))
    return sorted(ids)


def generate_params(
    model: Any, *, max_new_tokens: int, temperature: float, **overrides: Any
) -> GenerationParams:
    """Parameters equal to ``model.generate(max_new_tokens=..., do_sample=temperature > 0,
    temperature=...)``: top-k (default 50), top-p and the repetition penalty come from the model's
    generation config. Processors the engine lacks (``min_p``, ``no_repeat_ngram_size``, ...) are
    reported once in the log and not applied."""
    cfg = getattr(model, "generation_config", None)

    def get(name: str, default: Any) -> Any:
        value = getattr(cfg, name, None)
        return default if value is None else value

    odd = [k for k, v in _UNSUPPORTED.items() if get(k, v) != v]
    if odd:
        log.warning("the generation config sets %s; the engine does not apply them", ", ".join(odd))
    sampled = temperature > 0
    top_p = float(get("top_p", 1.0))
    kw: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_k": int(get("top_k", 50)) if sampled else None,
        "top_p": top_p if sampled and top_p < 1.0 else None,
        "repetition_penalty": float(get("repetition_penalty", 1.0)),
    }
    return GenerationParams(**(kw | overrides))


class LocalEngine:
    """Batched, KV-cached generation with ``model`` on its own device.

    ``eos_ids``: the ids that end a row (default :func:`stop_token_ids`); ``render``: chat messages to
    prompt ids (default ``encoding.render_prompt_ids``); ``batch_size``: prompts decoded together
    (``None``: all of them). A batch of one decodes exactly as ``model.generate`` does; rows decoded
    together are left-padded (their numbers can differ from a run alone by float rounding)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        eos_ids: Sequence[int] | None = None,
        render: Callable[[list[dict[str, Any]]], list[int]] | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = list(eos_ids) if eos_ids is not None else stop_token_ids(model, tokenizer)
        self.pad_id = encoding.pad_id(tokenizer)
        self.render = render or (lambda messages: encoding.render_prompt_ids(tokenizer, messages))
        self.batch_size = batch_size

    def complete(
        self, conversations: Sequence[list[dict[str, Any]]], params: GenerationParams
    ) -> list[Completion]:
        """One answer per conversation (chat messages; the generation prompt is added)."""
        return self.generate([self.render(list(m)) for m in conversations], params)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: GenerationParams, *, generator: Any = None
    ) -> list[Completion]:
        """One answer per prompt of token ids. ``generator`` (a ``torch.Generator``) overrides
        ``params.seed`` for the draws."""
        step = self.batch_size or max(1, len(prompts))
        if generator is None and params.seed is not None and params.temperature > 0:
            import torch

            generator = torch.Generator().manual_seed(params.seed)
        out: list[Completion] = []
        for i in range(0, len(prompts), step):
            out += self._batch([list(p) for p in prompts[i : i + step]], params, generator)
        return out

    def _batch(self, prompts: list[list[int]], params: GenerationParams, generator: Any) -> list[Completion]:
        import torch

        from .engine import decode_rows, prefill

        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                pre = prefill(model, prompts, self.pad_id)
                got = decode_rows(
                    model, pre, max_new_tokens=params.max_new_tokens, eos_ids=self.eos_ids,
                    temperature=params.temperature, generator=generator, top_k=params.top_k,
                    top_p=params.top_p, repetition_penalty=params.repetition_penalty, context=prompts,
                    stop=self._stopper(params.stop), logprobs=params.logprobs,
                )  # fmt: skip
        finally:
            model.train(was_training)
        return [
            Completion(
                text=self._text(ids, params.stop),
                finish_reason="stop" if ended else "length",
                prompt_tokens=len(p),
                completion_tokens=len(ids),
                token_ids=ids,
                logprobs=got.logprobs[k] if got.logprobs is not None else None,
            )
            for k, (p, ids, ended) in enumerate(zip(prompts, got.ids, got.ended, strict=True))
        ]

    def _stopper(self, stop: Sequence[str]) -> Callable[[list[int]], bool] | None:
        """True once a row's newest tokens complete one of ``stop`` (its tail is decoded: a stop string
        spans at most its length in tokens, plus a few for bytes split across tokens)."""
        if not stop:
            return None
        width, tok = max(len(s) for s in stop) + 4, self.tokenizer
        return lambda ids: any(s in tok.decode(ids[-width:]) for s in stop)

    def _text(self, ids: list[int], stop: Sequence[str]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cuts = [k for k in (text.find(s) for s in stop) if k >= 0]
        return text[: min(cuts)] if cuts else text
