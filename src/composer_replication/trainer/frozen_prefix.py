"""Do the work of a model's first decoder layers once for every model that shares them.

A LoRA adapter on the last layers leaves the first ``n`` decoder layers (and the embeddings) of the base
model untouched, so measuring the base model and then several adapters on the same prompts repeats the
same computation in those layers: with adapters on the last 8 of SmolLM2-135M's 30 layers, 22 of 30
layers of every held-out prefill. :class:`FrozenPrefix` records, per forward call, what those layers
produce (layer ``n - 1``'s output and the keys/values each of them adds to the KV cache) at the first
model, and replays it at every later model whose first ``n`` layers hold the very same weights (a
fingerprint of their bytes): that model runs only layers ``n`` and up. The same inputs through the same
weights in the same shapes give the same bits, so a replayed call returns exactly what the full forward
returns (tested to equality); a model whose first layers differ is run in full.

Key only calls whose inputs and prior KV cache do not depend on the model: prefills of fixed prompts and
teacher-forced continuations of fixed tokens, never decoding steps. A replayed call whose embeddings,
positions or attention mask differ from the recorded ones raises instead of answering wrongly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def decoder_layers(model: Any) -> nn.ModuleList:
    """The decoder's layers (through any PEFT wrapper): the ``ModuleList`` named ``...layers`` holding
    ``config.num_hidden_layers`` modules."""
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n and name.endswith("layers"):
            return mod
    raise ValueError(f"no list of {n} decoder layers in {type(model).__name__}")


def _update(h: Any, t: torch.Tensor) -> None:
    t = t.detach().contiguous().cpu()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(t.view(torch.uint8).numpy().tobytes())


def fingerprint(model: Any, n: int) -> str:
    """A digest of the names and bytes of every parameter and buffer of the input embeddings and the
    first ``n`` decoder layers (an adapter module there changes it, even one that adds zero)."""
    h = hashlib.blake2b(digest_size=16)
    for mod in (model.get_input_embeddings(), *decoder_layers(model)[:n]):
        for name, t in (*mod.named_parameters(), *mod.named_buffers()):
            h.update(name.encode())
            _update(h, t)
    return h.hexdigest()


def _inputs_digest(hidden: torch.Tensor, kwargs: dict[str, Any]) -> str:
    """What the first layer is given: embeddings, positions, attention mask, the KV cache's length."""
    h = hashlib.blake2b(digest_size=16)
    _update(h, hidden)
    for name in ("position_ids", "attention_mask"):
        v = kwargs.get(name)
        h.update(name.encode())
        if isinstance(v, torch.Tensor):
            _update(h, v)
    cache = kwargs.get("cache")
    h.update(str(None if cache is None else cache.get_seq_length()).encode())
    return h.hexdigest()


@dataclass
class _Call:
    digest: str
    out: torch.Tensor  # layer n - 1's output
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None  # the keys/values each layer added (None: no cache)


class _Replay(nn.Module):
    """Stands in for decoder layer ``i`` < n during one replayed call."""

    def __init__(self, i: int, key: str, call: _Call, last: bool) -> None:
        super().__init__()
        self.i, self.key, self.call, self.last = i, key, call, last

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        cache = kwargs.get("cache")
        if self.i == 0 and _inputs_digest(hidden_states, kwargs) != self.call.digest:
            raise RuntimeError(f"frozen prefix: call {self.key!r} was given other inputs than were recorded")
        if cache is not None:
            if self.call.kv is None:
                raise RuntimeError(f"frozen prefix: call {self.key!r} was recorded without a KV cache")
            k, v = self.call.kv[self.i]
            cache.update(k, v, self.i)
        return self.call.out if self.last else hidden_states


class FrozenPrefix:
    """Records and replays the first ``n`` decoder layers' work per keyed forward call.

    ``with fp.bind(model):`` selects the model (the first one bound owns the recordings; a model whose
    first ``n`` layers differ from the owner's runs in full), then ``with fp.call(key):`` around exactly
    one forward call records it (first time) or replays it.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"shared layers must be >= 1, got {n}")
        self.n = n
        self.owner: str | None = None
        self.calls: dict[str, _Call] = {}
        self._layers: nn.ModuleList | None = None
        self.replayed = 0

    @contextmanager
    def bind(self, model: Any) -> Iterator[bool]:
        """Within, :meth:`call` records or replays for ``model``; yields whether it shares the layers."""
        fp = fingerprint(model, self.n)
        self.owner = self.owner or fp
        self._layers = decoder_layers(model) if fp == self.owner else None
        try:
            yield self._layers is not None
        finally:
            self._layers = None

    def call(self, key: str) -> Any:
        """A context around one forward call of the bound model (a no-op when none is bound)."""
        if self._layers is None:
            return nullcontext()
        rec = self.calls.get(key)
        return self._record(self._layers, key) if rec is None else self._replay(self._layers, key, rec)

    @contextmanager
    def _record(self, layers: nn.ModuleList, key: str) -> Iterator[None]:
        n = self.n
        seen: dict[str, Any] = {"kv": [None] * n}

        def first(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            seen["digest"], seen["width"] = _inputs_digest(hidden, kwargs), hidden.shape[1]
            seen["cached"] = kwargs.get("cache") is not None

        def after(i: int) -> Any:
            def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
                cache = kwargs.get("cache")
                if cache is not None:
                    layer, w = cache.layers[i], seen["width"]
                    if getattr(layer, "is_sliding", False):
                        seen["unsupported"] = True
                    else:
                        seen["kv"][i] = (layer.keys[..., -w:, :].clone(), layer.values[..., -w:, :].clone())
                if i == n - 1:
                    seen["out"] = (out[0] if isinstance(out, tuple) else out).detach().clone()

            return hook

        handles = [layers[0].register_forward_pre_hook(first, with_kwargs=True)]
        handles += [layers[i].register_forward_hook(after(i), with_kwargs=True) for i in range(n)]
        try:
            yield
            if "out" in seen and not seen.get("unsupported"):
                self.calls[key] = _Call(seen["digest"], seen["out"], seen["kv"] if seen["cached"] else None)
        finally:
            for h in handles:
                h.remove()

    @contextmanager
    def _replay(self, layers: nn.ModuleList, key: str, rec: _Call) -> Iterator[None]:
        kept = [layers[i] for i in range(self.n)]
        for i in range(self.n):
            layers[i] = _Replay(i, key, rec, last=i == self.n - 1)
        try:
            yield
            self.replayed += 1
        finally:
            for i, layer in enumerate(kept):
                layers[i] = layer
