"""compose_loss and the loss-seam functions: fused and chunked paths equal the full-logits path."""

from __future__ import annotations

import pytest
import torch

from composer_replication.batch import build_batch
from composer_replication.loss import compose_loss, lm_ce_channel, sdpo_channel, sequence_logprobs

TOL = 2e-5  # float32 model; the reference is the same model on the full-logits path


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _run(model, batch, mode, **kw):
    model.zero_grad(set_to_none=True)
    out = compose_loss(model, batch, alpha_sdpo=0.7, beta_replay=0.3, logits_mode=mode, **kw)
    out.total.backward()
    return out, _grads(model)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"sdpo_jsd_beta": 0.0, "sdpo_temperature": 0.8, "sdpo_top_k": 16, "lm_ce_label_smoothing": 0.1},
        {"sdpo_jsd_beta": 1.0, "sdpo_token_clip": 0.05, "dpo_variant": "simpo"},
        {"sdpo_wrapper": "taid", "taid_t": 0.4},
        {"sdpo_wrapper": "entropy_opd", "entropy_opd_h_max": 3.0, "sdpo_token_clip": 0.5},
    ],
)
def test_compose_loss_fused_and_chunked_equal_full(tiny_model, tiny_tokenizer, kw):
    batch = build_batch(tiny_tokenizer, ref_model=tiny_model)
    ref, g_ref = _run(tiny_model, batch, "full", **kw)
    for mode in ("fused", "chunked"):
        out, g = _run(tiny_model, batch, mode, **kw)
        for k, v in ref.detached().items():
            assert abs(out.detached()[k] - v) <= TOL * max(1.0, abs(v)), (mode, k)
        assert g.keys() == g_ref.keys()
        for name, gr in g_ref.items():
            err = (g[name] - gr).abs().max().item()
            assert err <= TOL * max(1.0, gr.abs().max().item()), (mode, name, err)
        for key in ("sdpo/teacher_entropy", "sdpo/top1_agreement"):
            if key in ref.metrics:
                assert abs(out.metrics[key] - ref.metrics[key]) < 1e-4, (mode, key)


def test_auto_mode_uses_fused_from_the_threshold(tiny_model, tiny_tokenizer, monkeypatch):
    from composer_replication.kernels import hf

    calls = []
    real = hf.hidden_states
    monkeypatch.setattr(
        "composer_replication.channels.hidden_states", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    batch = build_batch(tiny_tokenizer, ref_model=tiny_model)
    compose_loss(tiny_model, batch)  # V = 2048 < 32768: full logits
    assert calls == []
    monkeypatch.setattr(hf, "FUSED_MIN_VOCAB", 1024)
    compose_loss(tiny_model, batch)  # student, teacher, and the chosen+rejected forward: all fused
    assert len(calls) == 3


def test_seam_functions_take_logits_mode(tiny_model, tiny_tokenizer):
    batch = build_batch(tiny_tokenizer, ref_model=tiny_model)
    ids, resp = batch["input_ids"], batch["response_mask"]
    attn = batch["attention_mask"]
    ref = sequence_logprobs(tiny_model, ids, resp, attention_mask=attn, logits_mode="full")
    for mode in ("fused", "chunked"):
        out = sequence_logprobs(tiny_model, ids, resp, attention_mask=attn, logits_mode=mode)
        assert (out - ref).abs().max().item() < 1e-4
    ce_ref = lm_ce_channel(tiny_model, ids, resp, attention_mask=attn, logits_mode="full")
    ce = lm_ce_channel(tiny_model, ids, resp, attention_mask=attn, logits_mode="fused")
    assert ce.count == ce_ref.count and abs(float(ce.loss.detach()) - float(ce_ref.loss.detach())) < 1e-5
    args = (tiny_model, ids, batch["ctx_teacher_input_ids"], batch["sdpo_loss_mask"])
    kw = dict(
        response_mask=resp, attention_mask=attn, teacher_attention_mask=batch["ctx_teacher_attention_mask"]
    )
    sd_ref = sdpo_channel(*args, logits_mode="full", **kw)
    sd = sdpo_channel(*args, logits_mode="fused", **kw)
    assert sd.count == sd_ref.count and abs(float(sd.loss.detach()) - float(sd_ref.loss.detach())) < 1e-5
    with pytest.raises(ValueError, match="logits_mode"):
        sequence_logprobs(tiny_model, ids, resp, logits_mode="sparse")
    with pytest.raises(ValueError, match="head="):
        lm_ce_channel(tiny_model, ids, resp, hidden=torch.zeros(*ids.shape, 8))


@pytest.mark.slow
def test_compose_loss_fused_on_real_qwen_vocabulary(tiny_tokenizer):
    """Tiny Qwen2 with the real vocabulary (V = 151936): auto picks fused, equal to full."""
    from composer_replication.models import build_tiny_model

    model = build_tiny_model(vocab_size=151936, tokenizer=tiny_tokenizer, seed=0)
    batch = build_batch(tiny_tokenizer, ref_model=model, batch_size=1)
    ref, g_ref = _run(model, batch, "full")
    out, g = _run(model, batch, "auto")
    for k, v in ref.detached().items():
        assert abs(out.detached()[k] - v) <= TOL * max(1.0, abs(v)), k
    for name, gr in g_ref.items():
        assert (g[name] - gr).abs().max().item() <= TOL * max(1.0, gr.abs().max().item()), name
