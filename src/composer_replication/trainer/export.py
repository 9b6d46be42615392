"""The trained model as a directory users can load: ``save_pretrained`` weights + tokenizer, no optimizer.

One export path for the ``train`` command (``OUT/final/``) and the pipeline (``train/<phase>/final``):

- :func:`export_model` writes an in-memory model (a plain ``PreTrainedModel`` or a PEFT model) and its
  tokenizer. A PEFT model is written as its adapter (``adapter_config.json`` +
  ``adapter_model.safetensors``) unless ``merge=True``, which folds the adapter into the base weights.
  When the adapter's base is not a directory on disk (``model.path: tiny``), the base is written to
  ``final/base`` so the adapter can be loaded without our code.
- :func:`export_checkpoint` rebuilds the model from the config, restores a training checkpoint's
  trained weights (``state.pt`` or the sharded FSDP2 form, see ``trainer.checkpoint``) and exports it.
- :func:`usage` is the text the CLI prints: how to load the directory with transformers (and PEFT) and
  serve it with vLLM.

The tokenizer is written as the model was trained to speak (``wire``): in the native format its chat
template renders ``tools`` and ``tool_calls`` (the project's Hermes template where the model's own has no
tool support, with the response template ``transformers serve`` parses tool calls by), and
``generation_config.json`` stops generation at the end of the assistant turn. See docs/serving.md.

The directory is written into a temporary sibling and renamed into place; checkpoints keep the
optimizer, ``final/`` never holds it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_replication._io import swap_in_dir

__all__ = ["ExportedModel", "base_dir", "describe", "export_checkpoint", "export_model", "usage"]


@dataclass(frozen=True)
class ExportedModel:
    """Where the model went: ``path``; for an adapter, ``base`` is the base model directory it applies to."""

    path: Path
    adapter: bool = False
    base: Path | None = None
    lora_rank: int | None = None


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and callable(getattr(model, "merge_and_unload", None))


def _save_base(peft_model: Any, directory: Path) -> None:
    """The PEFT model's base weights without the adapter (its modules wrap each adapted layer)."""
    inner = peft_model.get_base_model()
    state = {
        k.replace(".base_layer.", "."): v
        for k, v in inner.state_dict().items()
        if "lora_" not in k and "modules_to_save" not in k
    }
    inner.save_pretrained(directory, state_dict=state)


def _save_tokenizer(tokenizer: Any, directory: Path) -> None:
    """``tokenizer`` as the model speaks (``wire.prepare_tokenizer`` in the native format), with the
    response template of the project's Hermes template when it carries that one."""
    from composer_replication import wire

    if wire.get_format() == "native":
        wire.prepare_tokenizer(tokenizer)
    before = getattr(tokenizer, "response_template", None)
    if tokenizer.chat_template == wire.HERMES_TEMPLATE and before is None:
        tokenizer.response_template = wire.HERMES_RESPONSE_TEMPLATE
    try:
        tokenizer.save_pretrained(directory)
    finally:
        tokenizer.response_template = before


def _save_generation_config(model: Any, tokenizer: Any, directory: Path) -> None:
    """``generation_config.json``: the model's, ending generation at the tokenizer's end-of-turn token too."""
    from transformers import GenerationConfig

    base = getattr(model, "generation_config", None)
    gc = GenerationConfig.from_dict(base.to_dict()) if base is not None else GenerationConfig()
    eos = gc.eos_token_id if isinstance(gc.eos_token_id, list) else [gc.eos_token_id]
    eos = [int(e) for e in eos if e is not None]
    if tokenizer.eos_token_id is not None and int(tokenizer.eos_token_id) not in eos:
        eos.append(int(tokenizer.eos_token_id))
    if eos:
        gc.eos_token_id = eos[0] if len(eos) == 1 else eos
    if gc.pad_token_id is None and tokenizer.pad_token_id is not None:
        gc.pad_token_id = int(tokenizer.pad_token_id)
    gc.save_pretrained(directory)


def export_model(
    model: Any, tokenizer: Any, target: str | Path, *, merge: bool = False, base_dir: str | Path | None = None
) -> ExportedModel:
    """Write ``model`` + ``tokenizer`` to ``target`` (atomically) and return what was written.

    A PEFT ``model`` is written as its adapter, or merged into its base with ``merge=True`` (this
    modifies ``model`` in place: export at the end of training). ``base_dir`` names the adapter's base
    model directory (written into ``adapter_config.json``); without one the base is saved to
    ``target/base``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    adapter = _is_peft(model) and not merge
    base: Path | None = None
    try:
        if _is_peft(model) and merge:
            model = model.merge_and_unload()
        if adapter:
            if base_dir is None:
                base = target / "base"
                _save_base(model, tmp / "base")
                _save_tokenizer(tokenizer, tmp / "base")
            else:
                base = Path(base_dir).resolve()
            model.save_pretrained(tmp)
            cfg_path = tmp / "adapter_config.json"
            data = json.loads(cfg_path.read_text())
            data["base_model_name_or_path"] = str(base)
            cfg_path.write_text(json.dumps(data, indent=2, sort_keys=True))
        else:
            model.save_pretrained(tmp)
        _save_tokenizer(tokenizer, tmp)
        _save_generation_config(model, tokenizer, tmp)
        swap_in_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    rank = None
    if adapter:
        rank = max(int(c.r) for c in model.peft_config.values())
    return ExportedModel(path=target, adapter=adapter, base=base, lora_rank=rank)


def base_dir(cfg: Any) -> Path | None:
    """The base model's directory on disk, or None for the in-memory ``tiny`` model."""
    if cfg.model.path == "tiny":
        return None
    if cfg.model.path == "default":
        from composer_replication.models import resolve_default_model

        return resolve_default_model()
    return Path(cfg.model.path)


def export_checkpoint(
    cfg: Any, checkpoint: str | Path | None, target: str | Path, *, merge: bool = False
) -> ExportedModel:
    """Rebuild ``cfg``'s model on the CPU, load ``checkpoint``'s trained weights, :func:`export_model` it.

    The weights keep the dtype they were trained in (recorded in the checkpoint). ``checkpoint`` is
    what ``checkpoint.latest_checkpoint`` found: None (no checkpoint) is a ``RuntimeError``.
    """
    import torch

    if checkpoint is None:
        raise RuntimeError(f"{target}: nothing to export, the run has no checkpoint (did training save one?)")

    from composer_replication.trainer import checkpoint as ckpt
    from composer_replication.trainer.prepare import load_model

    model, tok = load_model(cfg, torch.device("cpu"))
    dtype = ckpt.checkpoint_dtype(checkpoint)
    if dtype is not None:
        model.to(dtype=dtype)
    ckpt.restore_model(model, ckpt.load_trainable(checkpoint, model))
    return export_model(model, tok, target, merge=merge, base_dir=base_dir(cfg))


def describe(path: str | Path) -> ExportedModel:
    """What an exported directory holds (an adapter when it has ``adapter_config.json``)."""
    path = Path(path)
    cfg_path = path / "adapter_config.json"
    if not cfg_path.is_file():
        return ExportedModel(path=path)
    data = json.loads(cfg_path.read_text())
    return ExportedModel(
        path=path, adapter=True, base=Path(data["base_model_name_or_path"]), lora_rank=int(data.get("r", 0))
    )


def usage(exported: ExportedModel) -> str:
    """How to load ``exported`` with transformers (PEFT for an adapter) and serve it with vLLM."""
    path = exported.path
    if not exported.adapter:
        return "\n".join(
            [
                f"final model: {path}",
                "  load:  from transformers import AutoModelForCausalLM, AutoTokenizer",
                f'         model = AutoModelForCausalLM.from_pretrained("{path}")',
                f'         tok = AutoTokenizer.from_pretrained("{path}")',
                f"  serve: vllm serve {path} --enable-auto-tool-choice --tool-call-parser hermes",
                "         (docs/serving.md: the OpenAI-compatible endpoint and agent harnesses)",
            ]
        )
    return "\n".join(
        [
            f"final adapter: {path} (LoRA; base model: {exported.base}; --merge writes merged weights)",
            "  load:  from transformers import AutoModelForCausalLM, AutoTokenizer",
            "         from peft import PeftModel",
            f'         base = AutoModelForCausalLM.from_pretrained("{exported.base}")',
            f'         model = PeftModel.from_pretrained(base, "{path}")',
            f'         tok = AutoTokenizer.from_pretrained("{path}")',
            f"  serve: vllm serve {exported.base} --tokenizer {path} --enable-lora --lora-modules final={path}"
            + (f" --max-lora-rank {exported.lora_rank}" if (exported.lora_rank or 0) > 16 else "")
            + " --enable-auto-tool-choice --tool-call-parser hermes",
            "         (docs/serving.md: the OpenAI-compatible endpoint and agent harnesses)",
        ]
    )
