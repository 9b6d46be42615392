"""The all-reduce's fast path: read every other upload once, in windows, and check and average each
window while it is still in cache.

When a replica arrives at a round whose other uploads are all there (the last to arrive: the
round's critical path), it does not download them into whole-object buffers and average them
afterwards. One reader thread per upload streams the object through a few small reused buffers,
hashing each window as it lands; the calling thread (with one helper) takes the windows of every rank
in lockstep and accumulates them, in rank order, in float64 (a NaN or inf in any of them shows in
the sum) — the same operations per
element as :func:`~composer_replication.diloco.serverless.allreduce.fixed_order_mean`, so the result
has the same bits. Nothing is copied after the read, no page of a fresh object-sized buffer is
touched, and the mean costs little more than the reads.

It applies when every tensor has one floating dtype and every upload's safetensors header is
byte-for-byte this replica's own (same names, shapes, dtypes, offsets). The result is only a
candidate: the caller uses it if the round's manifest lists exactly these uploads with these digests.
Anything unexpected (an upload that would be rejected, a broken transfer, a different manifest)
hands the round to the general path, which judges every upload with its usual checks and reasons.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from composer_replication.diloco.serverless import digest, tensorfile
from composer_replication.diloco.serverless.mean import SLICE, SliceMean, upload_weight

__all__ = ["StreamedMean", "stream_mean", "fusable"]

WINDOW = 4 << 20  # bytes per window (a multiple of every itemsize and of the mean's slice)
_BUFFERS = 3  # windows in flight per upload


@dataclass
class StreamedMean:
    """The candidate mean (None: the general path must judge the round) and each rank's digest and weight."""

    mean: dict[str, torch.Tensor] | None
    digests: dict[int, str] = field(default_factory=dict)  # "<algorithm>:<hex>" as declared
    weights: dict[int, float] = field(default_factory=dict)


def fusable(like: Mapping[str, torch.Tensor]) -> bool:
    """Whether the fast path applies: at least one element, and one floating dtype throughout."""
    dtypes = {t.dtype for t in like.values()}
    return len(dtypes) == 1 and next(iter(dtypes)).is_floating_point and any(t.numel() for t in like.values())


def _read_exact(stream: Any, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = stream.readinto(view[got:])
        if not n:
            break
        got += n
    return got


class _Reader(threading.Thread):
    """Streams one upload's data region through ``_BUFFERS`` reused windows, hashing as it goes."""

    def __init__(self, stream: Any, hasher: Any, data_len: int, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="allreduce-stream")
        self.stream, self.hash, self.data_len, self.stop = stream, hasher, data_len, stop
        self.free: queue.Queue[Any] = queue.Queue()
        self.full: queue.Queue[tuple[Any, int]] = queue.Queue()
        for _ in range(min(_BUFFERS, -(-data_len // WINDOW))):
            self.free.put(np.empty(WINDOW, dtype=np.uint8))

    def run(self) -> None:
        pos = 0
        try:
            while pos < self.data_len:
                buf = self.free.get()
                if self.stop.is_set():
                    return
                want = min(WINDOW, self.data_len - pos)
                view = memoryview(buf)[:want]
                got = _read_exact(self.stream, view)
                self.hash.update(view[:got])
                if got < want:
                    self.full.put((None, pos + got))  # truncated
                    return
                self.full.put((buf, want))
                pos += want
            self.stream.readinto(bytearray(1))  # at the end: lets the client check and reuse the connection
        except Exception as exc:  # a broken transfer: the consumer hands the round to the general path
            self.full.put((exc, pos))


def _average(mean: SliceMean, slices: list[tuple[torch.Tensor, list[torch.Tensor]]]) -> bool:
    """Average each slice into its output; False as soon as one holds a NaN or inf."""
    return all(mean(out, sources, check_finite=True) for out, sources in slices)


def _segments(sizes: list[int], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """``(tensor index, start, end)`` element ranges of the tensors (flat, in file order) in [lo, hi)."""
    out, base = [], 0
    for i, n in enumerate(sizes):
        a, b = max(lo, base), min(hi, base + n)
        if a < b:
            out.append((i, a - base, b - base))
        base += n
    return out


@dataclass
class _Layout:
    """This replica's tensors as the uploads must hold them: header bytes, flat views, element offsets."""

    header: bytes
    names: list[str]
    own: list[torch.Tensor]
    sizes: list[int]
    starts: list[int]

    @classmethod
    def of(cls, like: Mapping[str, torch.Tensor]) -> _Layout:
        names = [n for n, t in tensorfile.layout(like) if t.numel()]
        own = [like[n].detach().cpu().contiguous().reshape(-1) for n in names]
        sizes = [t.numel() for t in own]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return cls(bytes(tensorfile.encode(like)[0]), names, own, sizes, starts)

    @property
    def itemsize(self) -> int:
        return self.own[0].element_size()

    @property
    def data_len(self) -> int:
        return sum(self.sizes) * self.itemsize


def _open(opener: Any, key: str, lay: _Layout, stop: threading.Event) -> tuple[_Reader, str, float] | None:
    """Open one upload: ``(reader, declared digest, weight)``, or None when its size, header or weight is
    not what this replica's own upload would have (the general path judges it)."""
    stream, size, meta = opener(key)
    head = bytearray(len(lay.header))
    got = _read_exact(stream, memoryview(head))
    if size != len(lay.header) + lay.data_len or got < len(lay.header) or bytes(head) != lay.header:
        stream.close()
        return None
    algorithm, declared = digest.expected(meta)
    if (w := upload_weight(meta)) is None:
        stream.close()
        return None
    return _Reader(stream, digest.new(algorithm, head), lay.data_len, stop), f"{algorithm}:{declared}", w


def _window_slices(
    lay: _Layout, lo: int, hi: int, windows: Mapping[int, torch.Tensor], outs: list[torch.Tensor],
    rank: int, ranks: list[int],
) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:  # fmt: skip
    """The window ``[lo, hi)`` cut into (output slice, sources in rank order): independent pieces."""
    slices = []
    for i, a, b in _segments(lay.sizes, lo, hi):
        off = lay.starts[i] - lo  # tensor i's element 0, in window coordinates
        srcs = {r: win[off + a : off + b] for r, win in windows.items()}
        srcs[rank] = lay.own[i][a:b]
        for c in range(0, b - a, SLICE):
            d = min(c + SLICE, b - a)
            slices.append((outs[i][a + c : a + d], [srcs[r][c:d] for r in ranks]))
    return slices


def _average_windows(
    lay: _Layout, readers: Mapping[int, _Reader], weights: Mapping[int, float], rank: int,
    helper: ThreadPoolExecutor,
) -> list[torch.Tensor] | None:  # fmt: skip
    """Take every reader's windows in lockstep and average them (two threads); None if a transfer was
    cut short or failed, or a value is not finite."""
    ranks = sorted([rank, *readers])
    means = [SliceMean([weights[r] for r in ranks]) for _ in range(2)]  # one per thread
    dtype, itemsize = lay.own[0].dtype, lay.itemsize
    outs = [torch.empty(n, dtype=dtype) for n in lay.sizes]
    n_elements, per_window = sum(lay.sizes), WINDOW // itemsize
    for lo in range(0, n_elements, per_window):
        windows: dict[int, torch.Tensor] = {}
        bufs: dict[int, Any] = {}
        for r, reader in readers.items():
            buf, n = reader.full.get()
            if not isinstance(buf, np.ndarray):  # cut short or failed
                return None
            bufs[r] = buf
            windows[r] = torch.frombuffer(buf, dtype=dtype, count=n // itemsize)
        slices = _window_slices(lay, lo, min(lo + per_window, n_elements), windows, outs, rank, ranks)
        other = helper.submit(_average, means[1], slices[1::2])
        finite = _average(means[0], slices[0::2])
        if not (other.result() and finite):
            return None  # a NaN or inf somewhere in this window
        for r, reader in readers.items():
            reader.free.put(bufs[r])  # the window is consumed: the reader may refill it
    return outs


def stream_mean(
    store: Any,
    keys: Mapping[int, str],
    like: Mapping[str, torch.Tensor],
    *,
    rank: int,
    weight: float,
) -> StreamedMean:
    """Stream the uploads ``keys`` (rank -> key, every rank but ``rank``) and average them with ``like``.

    Returns the candidate mean over ``keys`` plus this replica, or ``mean=None`` whenever anything is
    not as expected (the store cannot stream; an upload's size, header or weight is not this
    replica's; a value is not finite; a content does not match its digest; a transfer broke): the
    general path then judges every upload, with its usual reasons, and retries the transfers.
    """
    opener = getattr(store, "open_read", None)
    if opener is None:
        return StreamedMean(None)
    lay = _Layout.of(like)
    result = StreamedMean(None, weights={rank: float(weight)})
    stop = threading.Event()
    readers: dict[int, _Reader] = {}
    helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="allreduce-mean")
    try:
        for r in sorted(keys):
            opened = _open(opener, keys[r], lay, stop)
            if opened is None:
                return result
            readers[r], result.digests[r], result.weights[r] = opened
        for reader in readers.values():
            reader.start()
        outs = _average_windows(lay, readers, result.weights, rank, helper)
        if outs is None:
            return result
        for r, reader in readers.items():
            reader.join()
            if result.digests[r].partition(":")[2] != reader.hash.hexdigest():
                return result
        mean = {n: o.view(like[n].shape) for n, o in zip(lay.names, outs)}
        mean.update({n: torch.empty(t.shape, dtype=t.dtype) for n, t in like.items() if not t.numel()})
        result.mean = mean
        return result
    finally:
        helper.shutdown(wait=True)
        stop.set()
        for reader in readers.values():
            reader.free.put(None)  # wake a reader waiting for a buffer
            reader.stream.close()
            if reader.ident is not None:  # started
                reader.join(timeout=10)
