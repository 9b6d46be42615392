"""In-process teacher: a Hugging Face causal LM answering on this machine (offline use), through the one
generation engine (``generation.LocalEngine``: greedy at temperature 0, else sampled as ``generate`` samples).
The prompt is rendered with the request's ``tools`` (the chat template's tool support, ``wire``), and
the answer's ``<tool_call>`` blocks come back as ``tool_calls``, as from an endpoint with a tool parser.

The model is loaded once per ``model_path`` and calls run one at a time in a worker thread, so the
event loop stays responsive. Cost is ``tokens × price`` from the spec (normally 0 for local models).
A call cancelled in the event loop (a stop: ``teacher_replay.waits``) stops its worker thread at the
model's next decoder layer (`stop_on`), so the thread does not hold the process for the rest of a
generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from composer_replication._extras import require

from .base import ChatRequest, ChatResponse, TeacherError

_MODELS: dict[str, tuple[Any, Any]] = {}
_LOAD_LOCK = threading.Lock()


def preload(model_path: str) -> None:
    """Load (and keep) the model at ``model_path`` in this thread, before any call needs it: a caller
    that can interrupt its own thread (``pipeline.replay_stages``) loads here, since a load in the
    worker thread cannot be stopped once begun."""
    _load(model_path)


def _load(model_path: str) -> tuple[Any, Any]:
    with _LOAD_LOCK:
        if model_path not in _MODELS:
            require("hf", "transformers", purpose="the transformers teacher backend")
            from composer_replication.models import load_model_and_tokenizer

            model, tok = load_model_and_tokenizer(model_path)
            model.eval()
            _MODELS[model_path] = (model, tok)
        return _MODELS[model_path]


class GenerationCancelled(Exception):
    """Raised inside a worker thread's forward pass once its call was cancelled."""


@contextlib.contextmanager
def stop_on(model: Any, cancel: threading.Event) -> Iterator[None]:
    """While the body runs in this thread, every forward of ``model``'s layers (its
    ``ModuleList`` members, and the model itself) first checks ``cancel`` and raises `GenerationCancelled`
    once it is set. Other threads using the same model are not affected."""
    import torch

    me = threading.get_ident()

    def check(module: Any, args: Any) -> None:
        if cancel.is_set() and threading.get_ident() == me:
            raise GenerationCancelled("the call was cancelled")

    layers = [model, *(m for ml in model.modules() if isinstance(ml, torch.nn.ModuleList) for m in ml)]
    handles = [m.register_forward_pre_hook(check) for m in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def endpoint_answer(text: str) -> tuple[str, list[dict[str, Any]] | None]:
    """A model's raw answer as an endpoint with a tool parser returns it: the prose as content and its
    ``<tool_call>`` blocks as OpenAI ``tool_calls``. An answer holding a malformed call stays raw text
    (read as malformed, nothing lost)."""
    from composer_replication import wire

    parsed = wire.parse_openai_message({"content": text})
    if not parsed.ok or not parsed.tool_calls or wire.TOOL_CALL_OPEN not in text:
        return text, None
    return parsed.text, [wire.openai_tool_call(n, a, j) for j, (n, a) in enumerate(parsed.tool_calls)]


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
        from composer_replication import encoding
        from composer_replication.generation.local import LocalEngine, generate_params

        model, tok = _load(self.model_path)
        engine = LocalEngine(model, tok, render=lambda m: encoding.render_prompt_ids(tok, m, req.tools))
        params = generate_params(model, max_new_tokens=req.max_tokens, temperature=req.temperature)
        got = engine.complete([req.messages], params)[0]
        text, calls = endpoint_answer(got.text)
        return ChatResponse(
            text=text,
            prompt_tokens=got.prompt_tokens,
            completion_tokens=got.completion_tokens,
            cost_usd=None,
            finish_reason=got.finish_reason,
            tool_calls=calls,
        )

    def _generate_unless_cancelled(self, req: ChatRequest, cancel: threading.Event) -> ChatResponse:
        model, _ = _load(self.model_path)
        with stop_on(model, cancel):
            return self._generate(req)

    async def complete(self, req: ChatRequest) -> ChatResponse:
        async with self._lock:
            cancel = threading.Event()
            try:
                return await asyncio.to_thread(self._generate_unless_cancelled, req, cancel)
            except asyncio.CancelledError:
                cancel.set()  # the worker thread stops at its next layer instead of finishing the answer
                raise
            except (ImportError, ValueError, OSError):
                raise
            except Exception as exc:  # a generation failure is one failed call, not a crashed run
                raise TeacherError(
                    f"local generation failed: {type(exc).__name__}: {exc}", retryable=False
                ) from exc

    async def aclose(self) -> None:
        return None
