"""API reference §5, `composer_replication.distillation`: SimPO, TAID (+ scheduler), entropy-aware OPD."""

from __future__ import annotations

import importlib
import inspect

import pytest

from ._helpers import check_same_object, check_signature, sig_id

# §5 distillation: the same function from the package and from its source module.
_SIMPO = """
def simpo_loss(
 chosen_avg_logprobs: torch.Tensor,
 rejected_avg_logprobs: torch.Tensor,
 *,
 beta: float = 2.0,
 gamma: float = 1.0,
) -> torch.Tensor
"""
_TAID = """
def taid_loss(
 student_logits: torch.Tensor,
 teacher_logits: torch.Tensor,
 mask: torch.Tensor | None = None,
 *,
 t: float | torch.Tensor,
) -> torch.Tensor
"""
_EOPD = """
def entropy_aware_opd_loss(
 student_logits: torch.Tensor,
 teacher_logits: torch.Tensor,
 *,
 labels: torch.Tensor | None = None,
 h_max: float | None = None,
 temperature: float = 1.0,
 reduction: str = "batchmean",
) -> torch.Tensor
"""
_TAID_SCHED = """
def __init__(self, num_train_steps, *, t_start=0.4, t_end=1.0, alpha=5e-4, beta=0.99,
             disable_adaptive=False, device="cpu")
"""
SIGNATURES: list[tuple[str, str, str, str]] = [
    ("composer_replication.distillation", "simpo_loss", _SIMPO, "def"),
    ("composer_replication.distillation.simpo", "simpo_loss", _SIMPO, "def"),
    (
        "composer_replication.distillation.simpo",
        "avg_sequence_logprob",
        """
        def avg_sequence_logprob(
         model_logprobs: torch.Tensor,
         response_mask: torch.Tensor,
        ) -> torch.Tensor
        """,
        "def",
    ),
    ("composer_replication.distillation", "taid_loss", _TAID, "def"),
    ("composer_replication.distillation.taid", "taid_loss", _TAID, "def"),
    ("composer_replication.distillation", "TAIDScheduler.__init__", _TAID_SCHED, "def"),
    (
        "composer_replication.distillation",
        "TAIDScheduler.update_t",
        "def update_t(self, loss, global_step)",
        "def",
    ),
    ("composer_replication.distillation", "entropy_aware_opd_loss", _EOPD, "def"),
    ("composer_replication.distillation.entropy_aware_opd", "entropy_aware_opd_loss", _EOPD, "def"),
    (
        "composer_replication.distillation.entropy_aware_opd",
        "teacher_entropy",
        "def teacher_entropy(teacher_logits)",
        "def",
    ),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


SAME_OBJECT: list[tuple[str, str, str]] = [
    ("composer_replication.distillation", "simpo_loss", "composer_replication.distillation.simpo"),
    ("composer_replication.distillation", "taid_loss", "composer_replication.distillation.taid"),
    (
        "composer_replication.distillation",
        "entropy_aware_opd_loss",
        "composer_replication.distillation.entropy_aware_opd",
    ),
]


@pytest.mark.parametrize("row", SAME_OBJECT, ids=lambda r: f"{r[0]}.{r[1]}")
def test_same_object(row):
    check_same_object(row)


MODULES = [
    "composer_replication.distillation",
    "composer_replication.distillation.simpo",
    "composer_replication.distillation.taid",
    "composer_replication.distillation.entropy_aware_opd",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_taid_scheduler_t_is_a_property():
    from composer_replication.distillation import TAIDScheduler

    assert isinstance(inspect.getattr_static(TAIDScheduler, "t"), property)
    sched = TAIDScheduler(num_train_steps=10)
    assert isinstance(sched.t, float) and sched.t == pytest.approx(0.4)


def test_teacher_entropy_in_all():
    from composer_replication.distillation import entropy_aware_opd

    assert "teacher_entropy" in entropy_aware_opd.__all__


def test_simpo_shape_mismatch():
    import torch

    from composer_replication.distillation import simpo_loss

    with pytest.raises(ValueError):
        simpo_loss(torch.zeros(2), torch.zeros(3))


def test_taid_shape_mismatch():
    import torch

    from composer_replication.distillation import taid_loss

    with pytest.raises(ValueError):
        taid_loss(torch.randn(2, 3, 5), torch.randn(2, 3, 6), t=0.5)


@pytest.mark.parametrize("case", ["logits", "labels", "reduction"])
def test_entropy_aware_opd_errors(case):
    import torch

    from composer_replication.distillation import entropy_aware_opd_loss

    s, t = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    kwargs: dict = {}
    if case == "logits":
        t = torch.randn(2, 4, 5)
    elif case == "labels":
        kwargs["labels"] = torch.ones(2, 4)
    else:
        kwargs["reduction"] = "bogus"
    with pytest.raises(ValueError):
        entropy_aware_opd_loss(s, t, **kwargs)
