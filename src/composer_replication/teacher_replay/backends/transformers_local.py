"""In-process teacher: a Hugging Face causal LM answering on this machine (offline use), through the one
generation engine (``generation.LocalEngine``: greedy at temperature 0, else sampled as ``generate`` samples).

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
        from composer_replication.generation.local import LocalEngine, generate_params

        model, tok = _load(self.model_path)
        engine = LocalEngine(model, tok)
        params = generate_params(model, max_new_tokens=req.max_tokens, temperature=req.temperature)
        got = engine.complete([req.messages], params)[0]
        return ChatResponse(
            text=got.text,
            prompt_tokens=got.prompt_tokens,
            completion_tokens=got.completion_tokens,
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
