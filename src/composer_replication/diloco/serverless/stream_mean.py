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
    parts = tensorfile.encode(like)
    header = bytes(parts[0])
    names = [n for n, t in tensorfile.layout(like) if t.numel()]
    own = [like[n].detach().cpu().contiguous().reshape(-1) for n in names]
    sizes = [t.numel() for t in own]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    dtype = own[0].dtype
    itemsize = own[0].element_size()
    data_len = sum(sizes) * itemsize
    result = StreamedMean(None, weights={rank: float(weight)})
    n_elements = sum(sizes)
    stop = threading.Event()
    readers: dict[int, _Reader] = {}
    helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="allreduce-mean")
    try:
        for r in sorted(keys):
            stream, size, meta = opener(keys[r])
            head = bytearray(len(header))
            got = _read_exact(stream, memoryview(head))
            if size != len(header) + data_len or got < len(header) or bytes(head) != header:
                stream.close()
                return result
            algorithm, declared = digest.expected(meta)
            hasher = digest.new(algorithm, head)
            if (w := upload_weight(meta)) is None:
                stream.close()
                return result
            result.weights[r] = w
            result.digests[r] = f"{algorithm}:{declared}"
            readers[r] = _Reader(stream, hasher, data_len, stop)
        for reader in readers.values():
            reader.start()
        ranks = sorted([rank, *readers])
        means = [SliceMean([result.weights[r] for r in ranks]) for _ in range(2)]  # one per thread
        outs = [torch.empty(n, dtype=dtype) for n in sizes]
        per_window = WINDOW // itemsize
        for lo in range(0, n_elements, per_window):
            hi = min(lo + per_window, n_elements)
            windows: dict[int, torch.Tensor] = {}
            bufs: dict[int, Any] = {}
            for r, reader in readers.items():
                buf, n = reader.full.get()
                if not isinstance(buf, np.ndarray):  # cut short or failed
                    return result
                bufs[r] = buf
                windows[r] = torch.frombuffer(buf, dtype=dtype, count=n // itemsize)
            slices = []  # (output, sources in rank order): independent, so two threads share them
            for i, a, b in _segments(sizes, lo, hi):
                off = starts[i] - lo  # tensor i's element 0, in window coordinates
                srcs = {r: win[off + a : off + b] for r, win in windows.items()}
                srcs[rank] = own[i][a:b]
                for c in range(0, b - a, SLICE):
                    d = min(c + SLICE, b - a)
                    slices.append((outs[i][a + c : a + d], [srcs[r][c:d] for r in ranks]))
            other = helper.submit(_average, means[1], slices[1::2])
            finite = _average(means[0], slices[0::2])
            if not (other.result() and finite):
                return result  # a NaN or inf somewhere in this window
            for r, reader in readers.items():
                reader.free.put(bufs[r])  # the window is consumed: the reader may refill it
        for r, reader in readers.items():
            reader.join()
            if result.digests[r].partition(":")[2] != reader.hash.hexdigest():
                return result
        mean = {n: o.view(like[n].shape) for n, o in zip(names, outs)}
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
