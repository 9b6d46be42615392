"""One generation engine for every caller that makes a model write (docs/generation.md).

- :mod:`.types`: :class:`GenerationParams` (what to generate) and :class:`Completion` (what came back),
  the same for the in-process engine and an OpenAI-compatible endpoint; :func:`tool_calls` reads an
  answer's tool calls through ``wire``.
- :mod:`.engine`: the decoding loop (prefill once with a KV cache, one token per step, finished rows
  leave the batch) and continuation scoring from a prefill's cache.
- :mod:`.local`: :class:`LocalEngine`, the loop behind ``complete(conversations, params)``.
- :mod:`.kv_buffer`: the KV cache layer that decodes into a buffer allocated once.

The HTTP twin of :class:`LocalEngine` is ``teacher_replay.endpoint.OpenAIEndpoint`` (it reuses the
teacher replay's OpenAI-compatible client). Names here resolve lazily: importing the package loads no torch.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import lazy_attr

_EXPORTS = {
    "Completion": "types",
    "GenerationParams": "types",
    "action_text": "types",
    "tool_calls": "types",
    "Decoded": "engine",
    "Prefill": "engine",
    "continuation_logits": "engine",
    "decode": "engine",
    "decode_rows": "engine",
    "eos_token_ids": "engine",
    "prefill": "engine",
    "sample": "engine",
    "LocalEngine": "local",
    "generate_params": "local",
    "stop_token_ids": "local",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attr(globals(), _EXPORTS, name)
