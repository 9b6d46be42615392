"""One torch thread for the sandbox tests: on a shared 2-core box, two spinning threads make a tiny-model
step take ~2 s instead of ~40 ms."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
