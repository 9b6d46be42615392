"""Large-vocabulary tests: one intra-op thread (tiny tensors; threads only contend on a shared CPU)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
