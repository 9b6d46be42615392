"""A KV cache layer that decodes into a buffer allocated once, instead of growing by ``torch.cat``.

``transformers``' ``DynamicLayer`` concatenates every new key and value onto the whole cache, so each
decoding step copies the cache: on CPU about a fifth of a 256-token greedy decode of SmolLM2-135M. A
:class:`BufferedLayer` holds the prompt's keys and values in a buffer with room for ``extra`` more
positions and writes each step in place; ``keys`` / ``values`` are views of the filled part, so
attention sees exactly the tensors the dynamic layer would hold (same values, same shapes).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class BufferedLayer(DynamicLayer):
    """A ``DynamicLayer`` with room for ``extra`` more positions after ``keys`` / ``values``."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, extra: int) -> None:
        super().__init__()
        b, h, n, d = keys.shape
        self._k = keys.new_empty(b, h, n + extra, d)
        self._v = values.new_empty(b, h, n + extra, values.shape[-1])
        self._k[:, :, :n], self._v[:, :, :n] = keys, values
        self.n, self.device, self.is_initialized = n, keys.device, True
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self.n], self._v[:, :, : self.n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        m = key_states.shape[-2]
        if self.n + m > self._k.shape[-2]:
            raise ValueError(f"KV buffer full: {self.n} + {m} positions > {self._k.shape[-2]}")
        self._k[:, :, self.n : self.n + m] = key_states
        self._v[:, :, self.n : self.n + m] = value_states
        self.n += m
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self._views()


def buffer_cache(cache: Any, extra: int) -> Any:
    """``cache`` with each plain ``DynamicLayer`` (others, e.g. sliding-window layers, are left as
    they are) replaced in place by a :class:`BufferedLayer` with room for ``extra`` more positions."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return cache
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.keys is not None and layer.values is not None:
            layers[i] = BufferedLayer(layer.keys, layer.values, extra)
    return cache
