"""JSON codec for the hot paths: orjson when installed (several times faster), else the standard library.

Both give the same parsed values; encoded bytes differ only in whitespace-free separators (both compact).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - exercised by forcing the fallback in a test
    orjson = None  # type: ignore[assignment]

JSONDecodeError: type[Exception] = orjson.JSONDecodeError if orjson is not None else json.JSONDecodeError


def _std_loads(data: bytes | str) -> Any:
    return json.loads(data)


def _std_dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str).encode()


def _orjson_dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=str)


loads = orjson.loads if orjson is not None else _std_loads
dumps = _orjson_dumps if orjson is not None else _std_dumps


def dumps_lines(objs: Iterable[Any]) -> bytes:
    """``b"".join(dumps(o) + b"\\n" for o in objs)``, the same bytes, with the newline added by the encoder."""
    if orjson is None or dumps is not _orjson_dumps:  # the standard library's (or a test's) encoder
        one = dumps
        return b"".join([one(o) + b"\n" for o in objs])
    enc, opt = orjson.dumps, orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE
    return b"".join([enc(o, option=opt, default=str) for o in objs])


def dumps_pretty(obj: Any) -> bytes:
    """Indented JSON (for files people read, such as ``ingest_stats.json``)."""
    if orjson is not None:
        return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str)
    return json.dumps(obj, indent=2, ensure_ascii=False, default=str).encode()
