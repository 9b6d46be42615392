"""API reference §2, `composer_replication.loss`: `compose_loss`, `LossComponents`, the documented errors."""

from __future__ import annotations

import importlib

import pytest

from ._helpers import check_dataclass, check_signature, sig_id

SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        "composer_replication.loss",
        "compose_loss",
        """
        def compose_loss(
         model: torch.nn.Module,
         inputs: dict[str, torch.Tensor],
         *,
         alpha_sdpo: float = 0.1,
         beta_replay: float = 0.05,
         sdpo_jsd_beta: float = 0.5,
         sdpo_temperature: float = 1.0,
         sdpo_token_clip: float | None = None,
         replay_dpo_beta: float = 0.1,
         lm_ce_label_smoothing: float = 0.0,
         dpo_variant: Literal["dpo", "simpo"] = "dpo",
         sdpo_wrapper: Literal["none", "taid", "entropy_opd"] = "none",
         taid_t: float | None = None,
         simpo_beta: float = 2.0,
         simpo_gamma: float = 1.0,
         entropy_opd_h_max: float | None = None,
        ) -> LossComponents
        """,
        "def",
    ),
    ("composer_replication.loss", "LossComponents.detached", "def detached(self) -> dict[str, float]", "def"),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


DATACLASSES: list[tuple[str, str, str]] = [
    (
        "composer_replication.loss",
        "LossComponents",
        """
        @dataclass
        class LossComponents:
         lm_ce: torch.Tensor
         sdpo_jsd: torch.Tensor
         trace_replay_dpo: torch.Tensor
         total: torch.Tensor
        """,
    ),
]


@pytest.mark.parametrize("row", DATACLASSES, ids=lambda r: r[1])
def test_dataclass_fields(row):
    check_dataclass(row)


MODULES = [
    "composer_replication.loss",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_loss_components_detached():
    import torch

    from composer_replication.loss import LossComponents

    x = torch.tensor(1.5, requires_grad=True)
    c = LossComponents(lm_ce=x * 1, sdpo_jsd=x * 2, trace_replay_dpo=x * 3, total=x * 4)
    d = c.detached()
    assert d == {"lm_ce": 1.5, "sdpo_jsd": 3.0, "trace_replay_dpo": 4.5, "total": 6.0}
    assert all(type(v) is float for v in d.values())


@pytest.fixture()
def _one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def batch(tiny_tokenizer, _one_thread):
    from composer_replication.batch import build_batch

    return build_batch(tiny_tokenizer, align_sdpo_shapes=True)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dpo_variant": "ipo"}, "dpo_variant"),
        ({"sdpo_wrapper": "bogus"}, "sdpo_wrapper"),
        ({"sdpo_wrapper": "taid"}, "taid_t"),
        ({"sdpo_wrapper": "taid", "taid_t": 1.5}, "taid_t"),
        ({"sdpo_wrapper": "taid", "taid_t": -0.1}, "taid_t"),
    ],
    ids=["dpo_variant", "sdpo_wrapper", "taid_missing_t", "taid_t_above_1", "taid_t_below_0"],
)
def test_compose_loss_value_errors(tiny_model, batch, kwargs, match):
    from composer_replication.loss import compose_loss

    with pytest.raises(ValueError, match=match):
        compose_loss(tiny_model, batch, **kwargs)
