"""`train` writes OUT/final: a model plain transformers (and PEFT, for an adapter) loads with the trained logits."""

from __future__ import annotations

import json

import torch
import yaml

from composer_replication.trainer import checkpoint as ckpt

from .conftest import tiny_config


def _train(small_data, tmp_path, capsys, *extra, **sections):
    from composer_replication.cli.main import main

    cfg = tiny_config(small_data, schedule={"max_steps": 3, "batch_size": 2}, **sections)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    assert main(["train", str(tmp_path / "c.yaml"), "--out", str(out), *extra]) == 0
    return out, capsys.readouterr().out


def _trained_model(out, *, lora: dict | None = None):
    """The tiny model with the last checkpoint's weights, rebuilt here without the export code."""
    from composer_replication.models import build_tiny_model, build_tiny_tokenizer

    model = build_tiny_model(tokenizer=build_tiny_tokenizer(2048), seed=0)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
    state = torch.load(ckpt.latest_checkpoint(out / "checkpoints") / "state.pt", weights_only=False)
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    assert not unexpected
    return model.eval(), state


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[5, 17, 300, 42, 1000, 7, 99, 3]])


def test_final_is_a_plain_transformers_model_with_the_trained_logits(
    small_data, tmp_path, capsys, one_thread
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from composer_replication.models import build_tiny_model, build_tiny_tokenizer

    out, stdout = _train(small_data, tmp_path, capsys)
    final = out / "final"
    loaded = AutoModelForCausalLM.from_pretrained(final).eval()
    trained, state = _trained_model(out)
    assert torch.equal(_logits(loaded, IDS), _logits(trained, IDS))
    untrained = build_tiny_model(tokenizer=build_tiny_tokenizer(2048), seed=0).eval()
    assert not torch.allclose(_logits(loaded, IDS), _logits(untrained, IDS))  # training moved the weights

    tok = AutoTokenizer.from_pretrained(final)
    text = "def f(x):\n    return json.dumps(x)"
    assert tok(text)["input_ids"] == build_tiny_tokenizer(2048)(text)["input_ids"]
    # checkpoints keep the optimizer; final/ holds only the weights, tokenizer and config
    assert state["optimizer"]["state"] and state["model_dtype"] == "float32"
    assert not [p for p in final.rglob("*") if "optim" in p.name or p.suffix in (".pt", ".bin")]
    n_bytes = sum(p.numel() * p.element_size() for p in loaded.parameters())
    weights = sum(p.stat().st_size for p in final.glob("*.safetensors"))
    assert weights < 1.1 * n_bytes
    assert f"vllm serve {final}" in stdout and f'from_pretrained("{final}")' in stdout


LORA = {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
PEFT_LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def test_lora_final_is_an_adapter_peft_loads(small_data, tmp_path, capsys, one_thread):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out, stdout = _train(small_data, tmp_path, capsys, lora=LORA)
    final = out / "final"
    adapter_cfg = json.loads((final / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == str(final / "base")  # tiny: the base ships alongside
    base = AutoModelForCausalLM.from_pretrained(final / "base")
    loaded = PeftModel.from_pretrained(base, final).eval()
    trained, _ = _trained_model(out, lora=PEFT_LORA)
    assert torch.allclose(_logits(loaded, IDS), _logits(trained, IDS), rtol=0, atol=1e-6)
    with trained.disable_adapter():  # the adapter changes the logits, so the comparison can fail
        assert not torch.allclose(_logits(trained, IDS), _logits(loaded, IDS), atol=1e-4)
    assert "--enable-lora --lora-modules final=" in stdout and "PeftModel.from_pretrained" in stdout


def test_lora_merge_writes_plain_weights(small_data, tmp_path, capsys, one_thread):
    from transformers import AutoModelForCausalLM

    out, stdout = _train(small_data, tmp_path, capsys, "--merge", lora=LORA)
    final = out / "final"
    assert not (final / "adapter_config.json").exists() and (final / "config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(final).eval()
    trained, _ = _trained_model(out, lora=PEFT_LORA)
    assert torch.allclose(_logits(loaded, IDS), _logits(trained, IDS), rtol=0, atol=1e-5)
    assert f"vllm serve {final}" in stdout
