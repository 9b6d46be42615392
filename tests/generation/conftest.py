"""One torch thread for the generation tests: tiny models on a shared machine decode several times
faster without intra-op threads waiting on each other."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
