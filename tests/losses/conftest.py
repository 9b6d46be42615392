"""Loss tests run single-threaded: tiny float64 tensors gain nothing from threads, and on a shared
2-core machine oversubscribed intra-op threads make them ~10x slower."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
