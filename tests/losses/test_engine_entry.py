"""Each family's ``loss(..., engine=)`` entry: the same numbers as its named engines, clear errors, and
the layering of the loss code (generic kernels below the families, no private imports across files)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from composer_replication.kernels.fused_linear import LMHead
from composer_replication.losses import ce, eopd, gjsd, preference, taid

B, T, V, H = 2, 5, 29, 6
SRC = Path(gjsd.__file__).resolve().parents[1]


def _inputs():
    g = torch.Generator().manual_seed(3)
    s = torch.randn(B, T, V, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    hs = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    ht = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    head = LMHead(torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True))
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[:, :2] = -100
    return s, t, hs, ht, head, labels


def _same(a: torch.Tensor, b: torch.Tensor, *leaves: torch.Tensor) -> None:
    assert torch.equal(a.detach(), b.detach())
    for ga, gb in zip(torch.autograd.grad(a.sum(), leaves), torch.autograd.grad(b.sum(), leaves)):
        assert torch.equal(ga, gb)


def test_engine_entries_are_the_named_engines():
    s, t, hs, ht, head, labels = _inputs()
    mask = (labels != -100).double()
    kw = dict(beta=0.3, temperature=0.9, token_clip=2.0)
    _same(gjsd.loss(s, t, labels, **kw), gjsd.generalized_jsd_loss(s, t, labels, **kw), s)
    _same(
        gjsd.loss(s, t, labels, engine="chunked", **kw),
        gjsd.chunked_generalized_jsd_loss(s, t, labels, **kw),
        s,
    )
    _same(
        gjsd.loss(hs, ht, labels, engine="fused", head=head, **kw),
        gjsd.fused_generalized_jsd_loss(hs, ht, head, labels, **kw),
        hs,
        head.weight,
    )
    _same(taid.loss(s, t, mask, t=0.4), taid.taid_loss(s, t, mask, t=0.4), s)
    _same(taid.loss(s, t, mask, t=0.4, engine="chunked"), taid.chunked_taid_loss(s, t, mask, t=0.4), s)
    _same(
        taid.loss(hs, ht, mask, t=0.4, engine="fused", head=head),
        taid.fused_taid_loss(hs, ht, head, mask, t=0.4),
        hs,
    )
    ekw = dict(labels=labels, h_max=2.0, reduction="none")
    _same(eopd.loss(s, t, **ekw), eopd.entropy_aware_opd_loss(s, t, **ekw), s)
    _same(eopd.loss(s, t, engine="chunked", **ekw), eopd.chunked_entropy_aware_opd_loss(s, t, **ekw), s)
    _same(
        eopd.loss(hs, ht, engine="fused", head=head, **ekw),
        eopd.fused_entropy_aware_opd_loss(hs, ht, head, **ekw),
        hs,
    )
    _same(ce.logprobs(s, labels), ce.token_logprobs(s, labels), s)
    _same(ce.logprobs(s, labels, engine="chunked"), ce.chunked_token_logprobs(s, labels), s)
    _same(ce.logprobs(hs, labels, engine="fused", head=head), ce.fused_token_logprobs(hs, head, labels), hs)
    rows, lab = s.reshape(-1, V), labels.reshape(-1)
    _same(ce.loss(rows, lab, label_smoothing=0.1), ce.cross_entropy(rows, lab, label_smoothing=0.1), s)
    _same(
        ce.loss(rows, lab, label_smoothing=0.1, engine="chunked"),
        ce.chunked_cross_entropy(rows, lab, label_smoothing=0.1),
        s,
    )
    # The cross-entropy reference is PyTorch's own, and every engine agrees with it (fp64).
    for engine, x, hd in (("full", rows, None), ("chunked", rows, None), ("fused", hs.reshape(-1, H), head)):
        x_ref = rows if hd is None else hd.logits(x)
        want = torch.nn.functional.cross_entropy(x_ref, lab, label_smoothing=0.1)
        got = ce.loss(x, lab, label_smoothing=0.1, engine=engine, head=hd)
        assert abs(float(got.detach()) - float(want.detach())) < 1e-12, engine


def test_preference_entry_returns_loss_and_margin():
    c, r = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -4.5])
    rc, rr = torch.tensor([-3.5, -5.0]), torch.tensor([-4.0, -4.0])
    value, margin = preference.loss(c, r, variant="dpo", ref_chosen_logps=rc, ref_rejected_logps=rr, beta=0.5)
    assert torch.equal(value, preference.dpo_loss(c, r, rc, rr, beta=0.5))
    assert torch.allclose(margin, 0.5 * ((c - rc) - (r - rr)))
    value, margin = preference.loss(c, r, variant="simpo", simpo_beta=2.0, simpo_gamma=0.5)
    assert torch.equal(value, preference.simpo_loss(c, r, beta=2.0, gamma=0.5))
    assert torch.allclose(margin, 2.0 * (c - r) - 0.5)
    with pytest.raises(ValueError, match="dpo_variant"):
        preference.loss(c, r, variant="ipo")
    with pytest.raises(ValueError, match="ref_logprobs"):
        preference.loss(c, r, variant="dpo", ref_chosen_logps=rc)


def test_engine_errors_name_the_fix():
    s, t, hs, ht, head, labels = _inputs()
    with pytest.raises(ValueError, match="engine="):
        gjsd.loss(s, t, engine="sparse")
    with pytest.raises(ValueError, match="head="):
        taid.loss(hs, ht, t=0.5, engine="fused")
    with pytest.raises(ValueError, match="head="):
        eopd.loss(s, t, engine="chunked", head=head)
    with pytest.raises(ValueError, match="logits_are_probs"):
        gjsd.loss(hs, ht, logits_are_probs=True, engine="fused", head=head)
    with pytest.raises(ValueError, match="labels"):
        gjsd.loss(hs, ht, labels[:, :-1], engine="fused", head=head)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("composer_replication")
        ):
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("composer_replication")]
    return out


def test_kernels_know_no_family_and_nothing_imports_private_names():
    families = (
        "composer_replication.losses",
        "composer_replication.opsd",
        "composer_replication.distillation",
    )
    for path in sorted((SRC / "kernels").glob("*.py")):
        for module, _ in _imports(path):
            assert not module.startswith(families), f"{path.name} imports {module}: kernels must stay generic"
    area = [
        *(SRC / "kernels").glob("*.py"),
        *(SRC / "losses").glob("*.py"),
        *(SRC / "distillation").glob("*.py"),
    ]
    area += [SRC / "opsd.py", SRC / "loss.py", SRC / "channels.py"]
    for path in area:
        for module, names in _imports(path):
            private = [n for n in names if n.startswith("_")]
            assert not private, f"{path.name} imports private {private} from {module}"
