"""Shared fixtures: tiny offline models and tokenizers (never a download), thread settings, the loopback
OpenRouter server of the replay tests.

Test folders mirror the packages under ``src/composer_replication`` (see docs/architecture.md, "Tests").
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).parent / "data"
TESTS = Path(__file__).resolve().parent

# Folders whose tests run with one torch intra-op thread: tiny tensors and tiny models gain nothing from
# threads, and on a shared 2-core machine oversubscribed intra-op threads make them several times slower.
ONE_THREAD = frozenset(
    {"core", "datagen", "distillation", "generation", "kernels", "losses", "recipes", "safety"}
)


@pytest.fixture(autouse=True)
def _one_torch_thread(request):
    if Path(request.path).resolve().relative_to(TESTS).parts[0] not in ONE_THREAD:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


@pytest.fixture()
def fake_openrouter():
    """A real loopback server speaking the OpenRouter chat-completions subset (teacher replay's tests)."""
    from composer_replication.teacher_replay.fake_server import FakeOpenRouter

    srv = FakeOpenRouter().start()
    yield srv
    srv.stop()
