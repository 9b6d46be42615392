"""The one dispatch on ``TeacherSpec["backend"]``: each backend module is imported only when chosen."""

from __future__ import annotations

from typing import Any

from .base import Backend


def make_backend(spec: dict[str, Any], *, api_key: str | None, concurrency: int) -> Backend:
    kind = spec.get("backend", "openai")
    if kind == "openai":
        from .openai_compat import OpenAICompatBackend

        return OpenAICompatBackend(spec, api_key=api_key, concurrency=concurrency)
    if kind == "transformers":
        from .transformers_local import TransformersBackend

        return TransformersBackend(spec)
    raise ValueError(
        f"teacher {spec.get('slug')!r}: unknown backend {kind!r}; use 'openai' (any OpenAI-compatible server) "
        "or 'transformers' (in-process)"
    )
