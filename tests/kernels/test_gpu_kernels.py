"""TRL-Triton and Liger kernels against the pure-torch fused path (CUDA only)."""

from __future__ import annotations

import pytest
import torch

from composer_replication.kernels.fused_linear import LMHead
from composer_replication.kernels.triton_liger import available_backends, gpu_fused_gjsd
from composer_replication.losses.gjsd import fused_generalized_jsd_loss

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["trl", "liger"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gpu_backend_matches_torch_path(backend, beta):
    if backend not in available_backends():
        pytest.skip(f"{backend} kernels need CUDA and the package installed")
    torch.manual_seed(0)
    B, T, H, V = 2, 64, 64, 32768
    hs = torch.randn(B, T, H, device="cuda", requires_grad=True)
    ht = torch.randn(B, T, H, device="cuda")
    w = (torch.randn(V, H, device="cuda") / 4).requires_grad_()
    labels = torch.randint(0, V, (B, T), device="cuda")
    labels[:, :8] = -100
    ref = fused_generalized_jsd_loss(hs, ht, LMHead(w), labels, beta=beta, temperature=0.9)
    out = gpu_fused_gjsd(hs, ht, LMHead(w), labels, beta, 0.9, backend=backend)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-5)
    g_ref = torch.autograd.grad(ref, [hs, w])
    g_out = torch.autograd.grad(out, [hs, w])
    for a, b in zip(g_out, g_ref):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5)


def test_backends_empty_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert available_backends() == []
