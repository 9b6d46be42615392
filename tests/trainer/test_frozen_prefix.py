"""Replaying the shared first layers gives exactly the full forward's numbers, and only where it may."""

from __future__ import annotations

import pytest
import torch

from composer_replication.trainer.frozen_prefix import FrozenPrefix, decoder_layers, fingerprint
from composer_replication.trainer.offline_data import recovery_pairs
from composer_replication.trainer.onpolicy import error_sites
from composer_replication.trainer.site_eval import SiteSet


@pytest.fixture(scope="module")
def traces(ingested):
    from composer_replication.ingestion import read_examples

    return list(read_examples(ingested / "traces.jsonl"))


def _adapter(model, layer: int, seed: int):
    """A LoRA adapter on decoder layer ``layer`` only, with non-zero B (it changes the outputs)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=rf".*\.layers\.{layer}\.(self_attn|mlp)\.\w+_proj")
    peft = get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return peft


def _sites(tok, traces):
    return SiteSet(tok, error_sites(traces)[:5], pairs=recovery_pairs(traces)[:3], max_len=160,
                   max_new_tokens=6, batch_size=2)  # fmt: skip


def _same(a: dict, b: dict) -> None:
    for k in ("recovery_ce", "hinted_jsd", "teacher_recovery_ce", "pref_accuracy", "valid_rate", "answers"):
        assert a[k] == b[k], k
    assert a["per_site"] == b["per_site"]


def test_replayed_layers_give_the_full_forwards_numbers_exactly(traces, tiny_tokenizer, tiny_model):
    import copy

    n = len(decoder_layers(tiny_model)) - 1
    shared = _sites(tiny_tokenizer, traces)
    base_shared = shared.measure(tiny_model, shared_layers=n)  # records
    assert shared._prefix is not None and shared._prefix.replayed == 0 and shared._prefix.calls
    _same(base_shared, _sites(tiny_tokenizer, traces).measure(tiny_model))

    for seed in (1, 2):  # two adapters on the last layer: both replay the base model's first layers
        adapted = _adapter(copy.deepcopy(tiny_model), n, seed)
        before = shared._prefix.replayed
        got = shared.measure(adapted, shared_layers=n)
        assert shared._prefix.replayed > before
        want = _sites(tiny_tokenizer, traces).measure(adapted)
        _same(got, want)
        assert got["per_site"]["recovery_ce"] != base_shared["per_site"]["recovery_ce"]  # the adapter matters


def test_a_model_whose_first_layers_differ_is_measured_in_full(traces, tiny_tokenizer, tiny_model):
    import copy

    n = len(decoder_layers(tiny_model)) - 1
    shared = _sites(tiny_tokenizer, traces)
    shared.measure(tiny_model, greedy=False, shared_layers=n)
    for other in (_adapter(copy.deepcopy(tiny_model), 0, 3), copy.deepcopy(tiny_model)):
        if not hasattr(other, "peft_config"):
            with torch.no_grad():
                next(decoder_layers(other)[0].parameters()).add_(1e-3)
        assert fingerprint(other, n) != fingerprint(tiny_model, n)
        got = shared.measure(other, greedy=False, shared_layers=n)
        assert shared._prefix.replayed == 0
        _same_pre = _sites(tiny_tokenizer, traces).measure(other, greedy=False)
        assert got["per_site"] == _same_pre["per_site"]


def test_a_replayed_call_with_other_inputs_raises(tiny_model):
    fp = FrozenPrefix(1)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), fp.bind(tiny_model):
        with fp.call("k"):
            want = tiny_model(input_ids=ids).logits
        with fp.call("k"):
            assert torch.equal(tiny_model(input_ids=ids).logits, want)
        assert fp.replayed == 1
        with pytest.raises(RuntimeError, match="other inputs"), fp.call("k"):
            tiny_model(input_ids=torch.tensor([[5, 6, 7, 9]]))
    assert all(type(m).__name__ != "_Replay" for m in decoder_layers(tiny_model))  # layers put back


def test_bad_layer_count():
    with pytest.raises(ValueError, match=">= 1"):
        FrozenPrefix(0)
