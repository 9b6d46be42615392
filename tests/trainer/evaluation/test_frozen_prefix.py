"""Replaying the shared first layers gives exactly the full forward's numbers, and only where it may."""

from __future__ import annotations

import pytest
import torch

from composer_replication.trainer.data import recovery_pairs
from composer_replication.trainer.error_sites import error_sites
from composer_replication.trainer.evaluation.frozen_prefix import FrozenPrefix, decoder_layers, fingerprint
from composer_replication.trainer.evaluation.sites import SiteSet


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


def test_calls_are_replayed_by_content_and_the_layers_restored(tiny_model):
    fp = FrozenPrefix(1)
    ids, other = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[5, 6, 7, 9]])
    with torch.no_grad(), fp.bind(tiny_model, weights_fixed=True) as shared:
        assert shared
        want = tiny_model(input_ids=ids).logits
        assert torch.equal(tiny_model(input_ids=ids).logits, want) and fp.replayed == 1
        with fp.call("k"):  # a key narrows a call, the content still decides
            assert torch.equal(tiny_model(input_ids=ids).logits, want) and fp.replayed == 1
        got = tiny_model(input_ids=other).logits  # other tokens: recorded, not replayed
        assert fp.replayed == 1 and not torch.equal(got, want)
    assert all("forward" not in vars(m) for m in decoder_layers(tiny_model))  # layers put back
    with torch.no_grad():
        assert torch.equal(tiny_model(input_ids=other).logits, got)


def test_trainable_or_random_first_layers_are_never_shared(tiny_model):
    fp = FrozenPrefix(1)
    with fp.bind(tiny_model) as shared:  # a fresh model: every parameter trains
        assert not shared
    with fp.bind(tiny_model, weights_fixed=True) as shared:  # unless the caller says nothing updates
        assert shared
    for p in tiny_model.parameters():
        p.requires_grad_(False)
    tiny_model.config.attention_dropout = 0.1
    with fp.bind(tiny_model, weights_fixed=True) as shared:
        assert not shared


def test_bad_layer_count(tiny_model):
    with pytest.raises(ValueError, match=">= 1"):
        FrozenPrefix(0)
    with (
        pytest.raises(ValueError, match="decoder layers"),
        FrozenPrefix(9).bind(tiny_model, weights_fixed=True),
    ):
        pass


def test_training_steps_replayed_are_the_full_steps_exactly(ingested, tiny_tokenizer, tiny_model_dir):
    """SFT + on-policy SDPO + DPO steps of an adapter on the last layer: a second run of the same seed
    replays the first run's shared-layer work and ends with exactly the same losses and weights."""
    import copy

    from composer_replication.config import build_config
    from composer_replication.ingestion import read_examples
    from composer_replication.models import build_tiny_model
    from composer_replication.trainer.offline.stepper import OfflineStepper
    from composer_replication.trainer.prepare import apply_lora, seed_everything

    traces = list(read_examples(ingested / "traces.jsonl"))
    pairs = [dict(p) for p in recovery_pairs(traces)]
    cfg = build_config({
        "mode": "offline", "seed": 3, "model": {"path": str(tiny_model_dir)},
        "data": {"traces": str(ingested / "traces.jsonl"), "max_seq_len": 96, "max_dpo_seq_len": 96},
        "loss": {"sdpo": {"weight": 1.0, "source": "on_policy", "on_policy": {"max_new_tokens": 6}},
                 "preference": {"weight": 0.1}},
        "optimizer": {"lr": 0.01}, "schedule": {"max_steps": 3, "batch_size": 2},
        "lora": {"enabled": True, "r": 4, "alpha": 8, "target_modules": r".*\.layers\.1\.(self_attn|mlp)\.\w+_proj"},
        "logging": {"progress": False, "plot": False},
    })  # fmt: skip
    base = build_tiny_model(tokenizer=tiny_tokenizer, seed=0)

    def run(prefix: FrozenPrefix | None) -> tuple[list[dict], dict]:
        seed_everything(cfg.seed, True)
        model = apply_lora(copy.deepcopy(base), cfg)
        model.train()
        stepper = OfflineStepper(cfg, model, tiny_tokenizer, torch.device("cpu"), train_traces=traces,
                                 train_pairs=pairs)  # fmt: skip
        if prefix is None:
            log = [stepper.step() for _ in range(3)]
        else:
            with prefix.bind(model) as shared:
                assert shared
                log = [stepper.step() for _ in range(3)]
        return log, {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}

    want_log, want_w = run(None)
    prefix = FrozenPrefix(1)
    for _ in range(2):
        before = prefix.replayed
        log, w = run(prefix)
        assert log == want_log
        assert w.keys() == want_w.keys() and all(torch.equal(w[k], want_w[k]) for k in w)
    assert prefix.recorded > 0 and prefix.replayed - before >= 3  # at least each step's SFT batch


def test_the_fingerprint_covers_the_rotary_frequencies(tiny_model):
    """Same layer weights under another RoPE base give other layer outputs: never shared."""
    import copy

    other = copy.deepcopy(tiny_model)
    rotary = next(m for name, m in other.named_modules() if name.endswith("rotary_emb"))
    with torch.no_grad():
        rotary.inv_freq.mul_(0.5)
    assert fingerprint(other, 1) != fingerprint(tiny_model, 1)
