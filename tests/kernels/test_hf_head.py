"""Hidden states + LM head extraction, the logits-mode choice, and the GPU script's CPU-side parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from composer_replication.kernels import hf
from composer_replication.losses.ce import fused_token_logprobs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore_default_mode():
    mode, min_vocab = hf.get_default_logits_mode(), hf.FUSED_MIN_VOCAB
    yield
    hf.set_default_logits_mode(mode, min_vocab=min_vocab)


def test_head_and_hidden_reproduce_model_logits(tiny_model):
    ids = torch.randint(0, 2048, (2, 9))
    attn = torch.ones_like(ids)
    attn[0, :3] = 0  # left padding: the same position ids as loss.model_logits
    head = hf.lm_head_of(tiny_model, ids)
    assert head is not None
    assert head.weight is tiny_model.get_input_embeddings().weight  # tied embeddings: same parameter
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    ref = tiny_model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
    ours = head.logits(hf.hidden_states(tiny_model, ids, attn))
    assert (ours - ref).abs().max().item() < 1e-5


def test_fused_logprob_gradients_reach_the_tied_embedding(tiny_model):
    ids = torch.randint(0, 2048, (2, 8))
    labels = ids[:, 1:].clone()
    labels[0, :2] = -100
    head = hf.lm_head_of(tiny_model, ids)
    lp = fused_token_logprobs(hf.hidden_states(tiny_model, ids)[:, :-1], head, labels)
    (g_fused,) = torch.autograd.grad(lp.sum(), [tiny_model.get_input_embeddings().weight])
    logits = tiny_model(input_ids=ids, use_cache=False).logits[:, :-1]
    ref = torch.log_softmax(logits, -1).gather(-1, labels.clamp_min(0)[..., None])[..., 0] * (labels != -100)
    (g_ref,) = torch.autograd.grad(ref.sum(), [tiny_model.get_input_embeddings().weight])
    assert (lp - ref).abs().max().item() < 1e-5
    assert (g_fused - g_ref).abs().max().item() < 1e-5


def test_softcapped_gemma2_head():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, final_logit_softcapping=2.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(cfg)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(200.0)  # logits well past the cap, so it matters
    ids = torch.randint(0, 300, (1, 6))
    head = hf.lm_head_of(model, ids)
    assert head is not None and head.softcap == 2.0
    ref = model(input_ids=ids, use_cache=False).logits
    assert ref.abs().max().item() > 1.0
    assert (head.logits(hf.hidden_states(model, ids)) - ref).abs().max().item() < 1e-4


def test_unsupported_heads_fall_back(tiny_model):
    ids = torch.randint(0, 2048, (1, 5))
    tiny_model.config.logit_scale = 0.5  # a Cohere-style scale the head does not model
    assert hf.lm_head_of(tiny_model, ids) is None
    del tiny_model.config.logit_scale
    # A config that claims soft-capping the model does not apply: the numeric check rejects it.
    tiny_model.config.final_logit_softcapping = 0.01
    hf._verified.clear()
    assert hf.lm_head_of(tiny_model, ids) is None
    with pytest.warns(UserWarning, match="full logits"):
        assert hf.resolve_logits_mode(tiny_model, "fused", ids) == ("full", None)
    hf._verified.clear()


def test_resolve_logits_mode(tiny_model):
    ids = torch.randint(0, 2048, (1, 5))
    assert hf.resolve_logits_mode(tiny_model, "auto", ids) == ("full", None)  # V = 2048 < 32768
    assert hf.resolve_logits_mode(tiny_model, "chunked", ids) == ("chunked", None)
    mode, head = hf.resolve_logits_mode(tiny_model, "fused", ids)
    assert mode == "fused" and head.vocab_size == 2048
    hf.set_default_logits_mode("auto", min_vocab=1024)
    assert hf.resolve_logits_mode(tiny_model, None, ids)[0] == "fused"
    hf.set_default_logits_mode("full")
    assert hf.resolve_logits_mode(tiny_model, "auto", ids)[0] == "full"
    with pytest.raises(ValueError, match="logits_mode"):
        hf.resolve_logits_mode(tiny_model, "sparse", ids)
    with pytest.raises(ValueError, match="logits_mode"):
        hf.set_default_logits_mode("sparse")


def test_gpu_bench_parses_without_cuda():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), "--dry-run", "--T", "4096", "--variants", "fused,trl"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert '"plan": ["fused", "trl"]' in out.stdout and "4096" in out.stdout
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_bench.py"), "--dry-run", "--variants", "warp"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown variants" in bad.stderr


@pytest.mark.slow
def test_bench_gjsd_small_run(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_gjsd.py"), "--T", "16", "--V", "512", "--H", "32",
         "--out", str(out)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    import json

    res = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert all(r["status"] == "ok" and r["grad_finite"] for r in res.values()), res
    # Same inputs and seed for the logits variants, and for the hidden-state variants: same loss.
    assert abs(res["naive"]["loss"] - res["chunked"]["loss"]) < 1e-4 * max(1.0, res["naive"]["loss"])
    assert abs(res["fused"]["loss"] - res["trl"]["loss"]) < 1e-4 * max(1.0, res["fused"]["loss"])
