"""Shared fixtures: tiny offline models and tokenizers (never a download), thread settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from composer_replication.models import build_tiny_tokenizer

    return build_tiny_tokenizer(2048)


@pytest.fixture()
def tiny_model(tiny_tokenizer):
    """A fresh ~200k-parameter random Qwen2 per test (cheap: ~50 ms)."""
    from composer_replication.models import build_tiny_model

    return build_tiny_model(tokenizer=tiny_tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """The tiny model and tokenizer saved to disk, for code that loads by path."""
    from composer_replication.models import build_tiny_model, save_tiny_pair

    d = tmp_path_factory.mktemp("tiny-model")
    return save_tiny_pair(d, build_tiny_model(tokenizer=tiny_tokenizer, seed=0), tiny_tokenizer)
