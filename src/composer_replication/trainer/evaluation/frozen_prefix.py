"""Do the work of a model's first decoder layers once for every model and call that shares it.

A LoRA adapter on the last layers leaves the first ``n`` decoder layers (and the embeddings) of the base
model untouched, so training and measuring several adapters on the same data repeats the same computation
in those layers: with adapters on the last 8 of SmolLM2-135M's 30 layers, 22 of 30 layers of every
forward. :class:`FrozenPrefix` records, per forward call, what those layers produce (layer ``n - 1``'s
output, and the keys/values each adds to the KV cache) and replays it when the same call comes again, in
any model whose first ``n`` layers hold the very same weights (a fingerprint of their bytes, checked when
the model is bound): the layers then return the recorded tensors instead of computing. The same inputs
through the same weights in the same shapes give the same bits, so a replayed call returns exactly what
the full forward returns (tested to equality, training and measuring).

Which calls: one whose KV cache is empty or absent is addressed by its content (the embeddings,
positions, attention mask and autocast state the first layer receives); one continuing a cache is
replayed only under an explicit key (:meth:`FrozenPrefix.call`) from a caller that knows the cache holds
the same tokens, and its content is still checked; anything else (decoding steps) runs in full. Layers
with a trainable parameter or an active dropout are never shared (the model runs in full).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
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
    """A digest of the names and bytes of every parameter and buffer of the input embeddings, the rotary
    position embedding (its frequencies) and the first ``n`` decoder layers (an adapter module there
    changes it, even one that adds zero)."""
    h = hashlib.blake2b(digest_size=16)
    rotary = [m for name, m in model.named_modules() if name.endswith("rotary_emb")]
    for mod in (model.get_input_embeddings(), *rotary, *decoder_layers(model)[:n]):
        for name, t in (*mod.named_parameters(), *mod.named_buffers()):
            h.update(name.encode())
            _update(h, t)
    return h.hexdigest()


def _shareable(model: Any, n: int, weights_fixed: bool) -> bool:
    """Nothing in the first ``n`` layers or the embeddings trains (unless the caller says no weight
    changes while bound) or draws random numbers."""
    mods = (model.get_input_embeddings(), *decoder_layers(model)[:n])
    if not weights_fixed and any(p.requires_grad for m in mods for p in m.parameters()):
        return False
    if any(isinstance(x, nn.Dropout) and x.p > 0 for m in mods for x in m.modules()):
        return False
    return not float(getattr(model.config, "attention_dropout", 0.0) or 0.0) > 0


def _inputs_digest(hidden: torch.Tensor, kwargs: dict[str, Any]) -> str:
    """What the first layer is given: embeddings, positions, attention mask, cache length, autocast."""
    h = hashlib.blake2b(digest_size=16)
    _update(h, hidden)
    for name in ("position_ids", "attention_mask"):
        v = kwargs.get(name)
        h.update(name.encode())
        if isinstance(v, torch.Tensor):
            _update(h, v)
    cache = kwargs.get("cache")
    auto = torch.is_autocast_enabled(hidden.device.type)
    dtype = torch.get_autocast_dtype(hidden.device.type) if auto else None
    h.update(f"{None if cache is None else cache.get_seq_length()}|{auto}|{dtype}".encode())
    return h.hexdigest()


@dataclass
class _Call:
    out: torch.Tensor  # layer n - 1's output
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None  # the keys/values each layer added (None: no cache)

    def nbytes(self) -> int:
        kv = sum(k.nbytes + v.nbytes for k, v in self.kv or [])
        return self.out.nbytes + kv


class FrozenPrefix:
    """Records and replays the first ``n`` decoder layers' work (see the module's docstring).

    ``with fp.bind(model):`` patches those layers' ``forward`` for the block (the module tree and state
    dict stay as they are); the first model bound owns the recordings and a later one is shared only when
    its fingerprint is the same. Recordings are kept up to ``max_bytes`` (least recently used dropped).
    """

    def __init__(self, n: int, *, max_bytes: int = 3 << 30) -> None:
        if n < 1:
            raise ValueError(f"shared layers must be >= 1, got {n}")
        self.n, self.max_bytes = n, max_bytes
        self.owner: str | None = None
        self.calls: OrderedDict[str, _Call] = OrderedDict()
        self.replayed = self.recorded = 0
        self._key: str | None = None
        self._state: dict[str, Any] = {}

    @contextmanager
    def bind(self, model: Any, *, weights_fixed: bool = False) -> Iterator[bool]:
        """Within, ``model``'s forward calls are recorded and replayed; yields whether it is shared.
        Its first layers must not train, unless ``weights_fixed`` (nothing updates them in the block,
        e.g. a measurement under ``torch.no_grad``)."""
        layers = decoder_layers(model)
        if self.n > len(layers):
            raise ValueError(f"shared layers: {self.n} > the model's {len(layers)} decoder layers")
        fp = fingerprint(model, self.n) if _shareable(model, self.n, weights_fixed) else None
        self.owner = self.owner or fp
        if fp is None or fp != self.owner:
            yield False
            return
        own = [layers[i].__dict__.get("forward") for i in range(self.n)]  # e.g. accelerate's hooks
        for i in range(self.n):
            layers[i].forward = self._patched(i, layers[i].forward)
        try:
            yield True
        finally:
            for i, f in enumerate(own):
                if f is None:
                    del layers[i].forward
                else:
                    layers[i].forward = f
            self._state = {}

    @contextmanager
    def call(self, key: str) -> Iterator[None]:
        """Around one forward call that continues a KV cache holding the same tokens at every model."""
        self._key = key
        try:
            yield
        finally:
            self._key = None

    def _patched(self, i: int, forward: Any) -> Any:
        def run(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if i == 0:
                self._state = self._begin(hidden_states, kwargs)
            st = self._state
            if st.get("mode") == "replay":
                rec: _Call = st["rec"]
                if kwargs.get("cache") is not None:
                    if rec.kv is None:
                        raise RuntimeError("frozen prefix: a call recorded without a KV cache got one")
                    kwargs["cache"].update(*rec.kv[i], i)
                return rec.out.clone() if i == self.n - 1 else hidden_states  # a copy: callers may write
            out = forward(hidden_states, *args, **kwargs)
            if st.get("mode") == "record":
                self._capture(i, st, out, kwargs.get("cache"), hidden_states.shape[1])
            return out

        return run

    def _begin(self, hidden: torch.Tensor, kwargs: dict[str, Any]) -> dict[str, Any]:
        cache = kwargs.get("cache")
        fresh = cache is None or cache.get_seq_length() == 0
        if self._key is None and not fresh:
            return {"mode": "run"}  # a decoding step: its cache's contents are the model's own
        digest = _inputs_digest(hidden, kwargs)
        key = digest if self._key is None else f"{self._key}|{digest}"
        rec = self.calls.get(key)
        if rec is not None:
            self.calls.move_to_end(key)
            self.replayed += 1
            return {"mode": "replay", "rec": rec}
        return {"mode": "record", "key": key, "kv": [], "cached": cache is not None}

    def _capture(self, i: int, st: dict[str, Any], out: Any, cache: Any, width: int) -> None:
        if cache is not None:
            layer = cache.layers[i]
            if getattr(layer, "is_sliding", False):  # a window may have dropped positions: never shared
                st["mode"] = "run"
                return
            st["kv"].append((layer.keys[..., -width:, :].clone(), layer.values[..., -width:, :].clone()))
        if i == self.n - 1:
            hidden = (out[0] if isinstance(out, tuple) else out).detach().clone()
            rec = _Call(hidden, st["kv"] if st["cached"] else None)
            self.calls[st["key"]] = rec
            self.recorded += 1
            total = sum(c.nbytes() for c in self.calls.values())
            while total > self.max_bytes and len(self.calls) > 1:
                total -= self.calls.popitem(last=False)[1].nbytes()
