"""The glibc mmap-threshold pinning that keeps freed chunk tiles from staying resident."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_PROBE = textwrap.dedent(
    """
    import torch
    from composer_replication.kernels import allocator

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    # Free one 16 MiB block first: with the dynamic threshold this raises glibc's mmap threshold,
    # so the later tiles come from the heap and stay resident after free.
    applied = allocator.pin_mmap_threshold() if {pin} else False
    x = torch.ones(4 * 2**20); del x
    base = rss()
    keep = []
    for i in range(12):
        t = torch.ones(4 * 2**20)  # 16 MiB tiles, interleaved with small survivors
        keep.append(torch.ones(1024))
        del t
    print(applied, (rss() - base) / 2**20)
    """
)


def _run(pin: bool) -> tuple[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(pin=pin)], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_pinned_threshold_returns_freed_tiles():
    applied, grown = _run(pin=True)
    assert applied == "True"
    assert grown < 8.0  # MiB: each freed 16 MiB tile went back to the OS


def test_pin_is_once_per_process():
    from composer_replication.kernels import allocator

    allocator.pin_mmap_threshold()
    assert allocator.pin_mmap_threshold() is False
