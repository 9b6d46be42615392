"""safetensors files without copies: a tensor dict out as buffers, a file in as tensor views.

The all-reduce moves whole pseudo-gradients (538 MB for a 135M-parameter fp32 model) several times a
round, so it never builds the file as one ``bytes`` to upload, nor copies tensors out of a
downloaded buffer. :func:`encode` returns the file as a list of buffers (an 8-byte length and the
JSON header, then each tensor's own memory); :func:`decode` checks a downloaded file's structure as
strictly as the safetensors library does (header length and JSON, known dtypes, sizes that match the
shapes, tensors that tile the data exactly, no duplicate names) and returns tensors that are views
on the buffer. Both sides are plain safetensors: ``safetensors.torch.load`` reads what ``encode``
writes, and ``decode`` reads what ``safetensors.torch.save`` writes.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["encode", "decode", "layout", "nbytes", "finite"]

_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_CODES = {code: dtype for dtype, code in _DTYPES.items()}
_MAX_HEADER = 100_000_000  # the safetensors library's own limit
_U64 = struct.Struct("<Q")


def _byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without copying (any dtype, numpy-representable or not)."""
    return t.reshape(-1).view(torch.uint8).numpy().data


def layout(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """The tensors in file order: widest dtype first (every tensor stays aligned), then by name."""
    return sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))


def encode(tensors: Mapping[str, torch.Tensor]) -> list[Any]:
    """The safetensors file of ``tensors`` as buffers whose concatenation is the file.

    The tensor buffers are the tensors' own memory (contiguous CPU tensors are not copied): keep the
    tensors alive and unchanged until the buffers are written.
    """
    items = []
    for name, t in layout(tensors):
        t = t.detach().cpu().contiguous()
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} cannot be exchanged (use one of {sorted(_CODES)})")
        items.append((name, t))
    header: dict[str, Any] = {}
    offset = 0
    for name, t in items:
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return [_U64.pack(len(text)) + text] + [_byte_view(t) for _, t in items if t.numel()]


def nbytes(parts: list[Any]) -> int:
    """The length of the file ``parts`` make up."""
    return sum(memoryview(p).nbytes for p in parts)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate tensor name {key!r}")
        out[key] = value
    return out


def _entry(name: str, info: Any, data_len: int) -> tuple[int, int, torch.dtype, list[int]]:
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise ValueError(f"{name}: entry must have exactly dtype, shape and data_offsets")
    dtype = _CODES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise ValueError(f"{name}: unsupported dtype {info['dtype']!r}")
    shape, offsets = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"{name}: shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
        raise ValueError(f"{name}: data_offsets {offsets!r} is not [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        raise ValueError(f"{name}: data_offsets {offsets} outside the {data_len} data bytes")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if end - begin != math.prod(shape) * itemsize:
        raise ValueError(f"{name}: {end - begin} bytes for shape {shape} of {info['dtype']}")
    return begin, end, dtype, shape


def decode(buf: Any) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file in ``buf``, as views on it; ``ValueError`` says what is wrong.

    ``buf`` is a writable buffer (a ``bytearray``, a numpy ``uint8`` array); the tensors keep it alive.
    """
    view = memoryview(buf)
    if len(view) < 8:
        raise ValueError(f"{len(view)} bytes: shorter than the 8-byte header length")
    (n,) = _U64.unpack_from(view)
    if n > _MAX_HEADER or 8 + n > len(view):
        raise ValueError(f"header length {n} does not fit the {len(view)}-byte file")
    try:
        header = json.loads(bytes(view[8 : 8 + n]), object_pairs_hook=_unique)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("__metadata__ must map strings to strings")
    start, data_len = 8 + n, len(view) - 8 - n
    spans = sorted(
        ((*_entry(name, info, data_len), name) for name, info in header.items()),
        key=lambda s: (s[0], s[1], s[4]),
    )
    expected = 0
    for begin, end, _, _, name in spans:
        if begin != expected:
            raise ValueError(f"{name}: data starts at {begin}, expected {expected} (a gap or an overlap)")
        expected = end
    if expected != data_len:
        raise ValueError(f"the tensors cover {expected} of the {data_len} data bytes")
    out: dict[str, torch.Tensor] = {}
    for begin, end, dtype, shape, name in spans:
        count = math.prod(shape)
        if count == 0:
            out[name] = torch.empty(shape, dtype=dtype)
        elif (start + begin) % ((end - begin) // count):
            # misaligned (another writer's layout): copy this one tensor rather than view it
            out[name] = torch.frombuffer(bytearray(view[start + begin : start + end]), dtype=dtype).view(
                shape
            )
        else:
            out[name] = torch.frombuffer(buf, dtype=dtype, count=count, offset=start + begin).view(shape)
    return out


def finite(t: torch.Tensor) -> bool:
    """No NaN or inf in ``t``. A NaN or inf makes the (fast, native-dtype) sum non-finite; a sum that
    overflows without one is settled by the exact element-wise check."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    return math.isfinite(float(t.sum())) or bool(torch.isfinite(t).all())
