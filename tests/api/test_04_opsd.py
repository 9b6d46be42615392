"""API reference §4, `composer_replication.opsd`: `generalized_jsd_loss`."""

from __future__ import annotations

import importlib

import pytest

from ._helpers import check_signature, sig_id

SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        "composer_replication.opsd",
        "generalized_jsd_loss",
        """
        def generalized_jsd_loss(
         student_logits: torch.Tensor,
         teacher_logits: torch.Tensor,
         labels: torch.Tensor | None = None,
         beta: float = 0.5,
         temperature: float = 1.0,
         reduction: str = "batchmean",
         logits_are_probs: bool = False,
         top_k: int | None = None,
         token_clip: float | None = None,
        ) -> torch.Tensor
        """,
        "def",
    ),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


MODULES = [
    "composer_replication.opsd",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_generalized_jsd_unknown_reduction():
    import torch

    from composer_replication.opsd import generalized_jsd_loss

    s, t = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    with pytest.raises(ValueError):
        generalized_jsd_loss(s, t, reduction="bogus")
