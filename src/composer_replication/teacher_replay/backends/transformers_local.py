"""In-process teacher: a Hugging Face causal LM generating greedily on this machine (offline use).

The model is loaded once per ``model_path`` and calls run one at a time in a worker thread, so the
event loop stays responsive. Cost is ``tokens × price`` from the spec (normally 0 for local models).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from composer_replication._extras import require

from .base import ChatRequest, ChatResponse, TeacherError

_MODELS: dict[str, tuple[Any, Any]] = {}
_LOAD_LOCK = threading.Lock()


def _load(model_path: str) -> tuple[Any, Any]:
    with _LOAD_LOCK:
        if model_path not in _MODELS:
            require("hf", "transformers", purpose="the transformers teacher backend")
            from composer_replication.models import load_model_and_tokenizer

            model, tok = load_model_and_tokenizer(model_path)
            model.eval()
            _MODELS[model_path] = (model, tok)
        return _MODELS[model_path]


class TransformersBackend:
    def __init__(self, spec: dict[str, Any]) -> None:
        path = spec.get("model_path")
        if not path:
            raise ValueError(
                f"teacher {spec['slug']!r}: backend 'transformers' needs 'model_path' (a local model dir)"
            )
        self.model_path = str(path)
        self._lock = asyncio.Lock()

    def _generate(self, req: ChatRequest) -> ChatResponse:
        import torch

        model, tok = _load(self.model_path)
        enc = tok.apply_chat_template(
            req.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        input_ids = enc["input_ids"]
        gen_kwargs: dict[str, Any] = {"max_new_tokens": req.max_tokens, "pad_token_id": tok.pad_token_id}
        if req.temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=req.temperature)
        else:
            gen_kwargs.update(do_sample=False)
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=enc.get("attention_mask"), **gen_kwargs)
        new = out[0, input_ids.shape[1] :]
        text = tok.decode(new, skip_special_tokens=True)
        return ChatResponse(
            text=text,
            prompt_tokens=int(input_ids.shape[1]),
            completion_tokens=int(new.shape[0]),
            cost_usd=None,
        )

    async def complete(self, req: ChatRequest) -> ChatResponse:
        async with self._lock:
            try:
                return await asyncio.to_thread(self._generate, req)
            except (ImportError, ValueError, OSError):
                raise
            except Exception as exc:  # a generation failure is one failed call, not a crashed run
                raise TeacherError(
                    f"local generation failed: {type(exc).__name__}: {exc}", retryable=False
                ) from exc

    async def aclose(self) -> None:
        return None
