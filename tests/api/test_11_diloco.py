"""API reference §11, `composer_replication.diloco`: `make_diloco_outer_loop` and the module attributes."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from ._helpers import check_signature, sig_id

# §11 diloco
SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        "composer_replication.diloco",
        "make_diloco_outer_loop",
        """
        def make_diloco_outer_loop(
         manager: Any,
         model_fragments: list[torch.nn.Module],
         inner_optimizer: torch.optim.Optimizer,
         *,
         outer_lr: float = 0.7,
         outer_momentum: float = 0.9,
         nesterov: bool = True,
         sync_every: int = 100,
         fragment_sync_delay: int = 0,
         fragment_update_alpha: float = 0.0,
        ) -> Any
        """,
        "def",
    ),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


MODULES = [
    "composer_replication.diloco",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_diloco_module_attributes():
    from composer_replication import diloco

    for name in ("DiLoCo", "Manager", "_DummyWork", "_TORCHFT_AVAILABLE"):
        assert hasattr(diloco, name), f"composer_replication.diloco.{name} is missing"
    has_torchft = importlib.util.find_spec("torchft") is not None
    assert diloco._TORCHFT_AVAILABLE is has_torchft
    if has_torchft:
        import torchft.local_sgd
        import torchft.manager
        import torchft.work

        assert diloco.DiLoCo is torchft.local_sgd.DiLoCo
        assert diloco.Manager is torchft.manager.Manager
        assert diloco._DummyWork is torchft.work._DummyWork
    else:
        assert diloco.DiLoCo is None and diloco.Manager is None and diloco._DummyWork is None
