"""API reference §3, `composer_replication.batch`: `build_batch`."""

from __future__ import annotations

import importlib

import pytest

from ._helpers import check_signature, sig_id

SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        "composer_replication.batch",
        "build_batch",
        """
        def build_batch(
         tokenizer: Any,
         *,
         device: torch.device | str = "cpu",
         seed: int = 42,
         variant: str = "factorial",
         align_sdpo_shapes: bool = False,
        ) -> dict[str, torch.Tensor]
        """,
        "def",
    ),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


MODULES = [
    "composer_replication.batch",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_build_batch_unknown_variant(tiny_tokenizer):
    from composer_replication.batch import build_batch

    with pytest.raises(ValueError):
        build_batch(tiny_tokenizer, variant="no_such_variant")
