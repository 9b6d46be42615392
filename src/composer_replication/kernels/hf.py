"""Hidden states and LM head of a Hugging Face causal LM, and the choice of logits path.

The fused-linear losses need ``(B, T, H)`` final hidden states and the output projection instead of
``model(...).logits``. For the usual ``XForCausalLM`` (``logits = lm_head(base(...).last_hidden_state)``,
optionally Gemma-2 soft-capped) :func:`lm_head_of` returns the head and :func:`hidden_states` runs
the base model. Anything else (PEFT-wrapped heads, logit scaling, custom heads, models without a base
module) returns ``None`` and callers fall back to full logits. The first time a model class is used
the pattern is checked numerically on a 4-token input, so an unexpected architecture falls back
rather than computing a wrong loss.

``logits_mode`` (accepted by `loss.compose_loss` and the loss-seam functions):

- ``"full"``: the reference path, (B, T, V) logits and the reference losses;
- ``"chunked"``: full logits from the model, losses computed over token chunks (no (B, T, V)
  temporaries beyond the logits and their gradient);
- ``"fused"``: hidden states + head, the logits never exist (falls back to ``"full"`` with a warning
  when the model does not expose them);
- ``"auto"`` (default): ``"fused"`` when the vocabulary is at least :data:`FUSED_MIN_VOCAB` and the model
  supports it, else ``"full"``. Change the process-wide default with :func:`set_default_logits_mode`.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, cast

import torch

from composer_replication.kernels.fused_linear import LMHead

__all__ = [
    "FUSED_MIN_VOCAB",
    "LOGITS_MODES",
    "LogitsMode",
    "get_default_logits_mode",
    "hidden_states",
    "lm_head_of",
    "resolve_logits_mode",
    "set_default_logits_mode",
]

LogitsMode = Literal["auto", "full", "chunked", "fused"]
LOGITS_MODES = ("auto", "full", "chunked", "fused")
FUSED_MIN_VOCAB = 32768
_default_mode: str = "auto"
_verified: dict[tuple, bool] = {}
# Config fields that rescale logits in ways LMHead does not model (Cohere, Granite, ...).
_UNSUPPORTED_SCALES = ("logit_scale", "logits_scaling", "output_logits_scale")


def set_default_logits_mode(mode: str, *, min_vocab: int | None = None) -> None:
    """Set the process-wide mode used when a call passes ``logits_mode="auto"`` (or None).

    ``min_vocab`` changes the vocabulary size from which ``"auto"`` picks the fused path.
    """
    global _default_mode, FUSED_MIN_VOCAB
    if mode not in LOGITS_MODES:
        raise ValueError(f"logits_mode={mode!r} is unknown; use one of {LOGITS_MODES}")
    _default_mode = mode
    if min_vocab is not None:
        FUSED_MIN_VOCAB = int(min_vocab)


def get_default_logits_mode() -> str:
    return _default_mode


def _unwrap(model: Any) -> Any:
    get_base = getattr(model, "get_base_model", None)  # PEFT
    return get_base() if callable(get_base) else model


def _base_module(model: Any) -> Any:
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if prefix else None
    return base if isinstance(base, torch.nn.Module) and base is not model else None


def _head_of(model: Any) -> LMHead | None:
    cfg = getattr(model, "config", None)
    get_out = getattr(model, "get_output_embeddings", None)
    if cfg is None or not callable(get_out) or _base_module(model) is None:
        return None
    for name in _UNSUPPORTED_SCALES:
        value = getattr(cfg, name, None)
        if value is not None and float(value) != 1.0:
            return None
    head = get_out()
    if type(head) is not torch.nn.Linear:  # LoRA on the head, quantised or custom projections
        return None
    return LMHead(head.weight, head.bias, getattr(cfg, "final_logit_softcapping", None))


def hidden_states(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``(B, T, H)`` final hidden states, with the same position ids as ``loss.model_logits``."""
    base = _base_module(_unwrap(model))
    kwargs: dict[str, Any] = {"use_cache": False}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
        kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    return base(input_ids=input_ids, **kwargs).last_hidden_state


def _verify(model: Any, head: LMHead, input_ids: torch.Tensor) -> bool:
    """Does ``head(hidden_states)`` reproduce ``model(...).logits``? Checked once per model class."""
    key = (type(model), head.vocab_size, head.softcap, head.bias is not None)
    if key not in _verified:
        ids = input_ids[:1, :4]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                ref = model(input_ids=ids, use_cache=False).logits.float()
                ours = head.logits(hidden_states(model, ids)).float()
            _verified[key] = bool(torch.allclose(ref, ours, rtol=1e-3, atol=1e-3))
        except Exception:  # noqa: BLE001 - any failure means "not the standard pattern": use full logits
            _verified[key] = False
        finally:
            model.train(was_training)
    return _verified[key]


def lm_head_of(model: Any, input_ids: torch.Tensor | None = None) -> LMHead | None:
    """The model's output projection as an :class:`LMHead`, or None when the fused path cannot be used.

    Tied embeddings need nothing special: the head's weight *is* the embedding parameter, and its
    gradient from the fused loss is added to the embedding's by autograd.
    """
    inner = _unwrap(model)
    head = _head_of(inner)
    if head is None:
        return None
    if input_ids is not None and not _verify(inner, head, input_ids):
        return None
    return head


def resolve_logits_mode(
    model: Any, mode: str | None, input_ids: torch.Tensor | None = None
) -> tuple[LogitsMode, LMHead | None]:
    """``(mode, head)`` with ``mode`` in ``{"full", "chunked", "fused"}`` (head set only for fused)."""
    mode = _default_mode if mode in (None, "auto") else mode
    if mode not in LOGITS_MODES:
        raise ValueError(f"logits_mode={mode!r} is unknown; use one of {LOGITS_MODES}")
    if mode in ("full", "chunked"):
        return cast(LogitsMode, mode), None
    head = lm_head_of(model, input_ids)
    if mode == "fused":
        if head is None:
            warnings.warn(
                f"logits_mode='fused': {type(model).__name__} does not expose a plain LM head and final "
                "hidden states; using full logits",
                stacklevel=3,
            )
            return "full", None
        return "fused", head
    # auto
    if head is not None and head.vocab_size >= FUSED_MIN_VOCAB:
        return "fused", head
    return "full", None
