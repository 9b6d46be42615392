"""API reference §7, `composer_replication.replaysim`: `NormalizedDPOPair`, `DJNormalizer`,
`replay_and_normalize_trace`."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

from ._helpers import check_dataclass, check_same_object, check_signature, sig_id

# §7 replaysim
SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        "composer_replication.replaysim",
        "DJNormalizer.__init__",
        """
        def __init__(
         self,
         recipe_path: str | os.PathLike[str] | None = None,
         *,
         skip_dj: bool = False,
        ) -> None
        """,
        "def",
    ),
    (
        "composer_replication.replaysim",
        "DJNormalizer.normalize",
        """
        def normalize(
         self,
         pairs: Iterable[DPOPair | dict[str, Any]],
        ) -> list[NormalizedDPOPair]
        """,
        "def",
    ),
    (
        "composer_replication.replaysim",
        "replay_and_normalize_trace",
        """
        async def replay_and_normalize_trace(
         *,
         states: Any,
         teachers: Any = None,
         agreement_threshold: int = 2,
         max_total_usd: float = 5.0,
         normalizer: DJNormalizer | None = None,
         **replay_kwargs: Any,
        ) -> tuple[list[TeacherCallResult], list[NormalizedDPOPair]]
        """,
        "async",
    ),
    (
        "composer_replication.replaysim.normalize",
        "replay_and_normalize_trace_sync",
        "def replay_and_normalize_trace_sync(*args, **kwargs)",
        "def",
    ),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


DATACLASSES: list[tuple[str, str, str]] = [
    (
        "composer_replication.replaysim",
        "NormalizedDPOPair",
        """
        @dataclass
        class NormalizedDPOPair:
         state_id: str
         state_messages: list[dict[str, Any]]
         chosen_messages: list[dict[str, Any]]
         rejected_messages: list[dict[str, Any]]
         n_teachers_agreeing: int
         metadata: dict[str, Any]
        """,
    ),
]


@pytest.mark.parametrize("row", DATACLASSES, ids=lambda r: r[1])
def test_dataclass_fields(row):
    check_dataclass(row)


# Same object from each module that the reference (or its examples) imports it from.
SAME_OBJECT: list[tuple[str, str, str]] = [
    ("composer_replication.replaysim", "DPOPair", "composer_replication.teacher_replay"),
    ("composer_replication.replaysim", "TeacherCallResult", "composer_replication.teacher_replay"),
    ("composer_replication.replaysim", "extract_dpo_pairs", "composer_replication.teacher_replay"),
    ("composer_replication.replaysim", "replay_trace", "composer_replication.teacher_replay"),
]


@pytest.mark.parametrize("row", SAME_OBJECT, ids=lambda r: f"{r[0]}.{r[1]}")
def test_same_object(row):
    check_same_object(row)


MODULES = [
    "composer_replication.replaysim",
    "composer_replication.replaysim.normalize",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_dj_normalizer_default_recipe_on_disk():
    from composer_replication.replaysim import DJNormalizer

    recipe = DJNormalizer.DEFAULT_RECIPE
    assert isinstance(recipe, Path)
    assert recipe.parts[-4:] == ("composer_replication", "recipes", "replaysim", "default.yaml")
    assert recipe.is_file()


def test_dj_normalizer_missing_recipe(tmp_path):
    from composer_replication.replaysim import DJNormalizer

    missing = tmp_path / "no_such_recipe.yaml"
    if importlib.util.find_spec("data_juicer") is not None:
        with pytest.raises(FileNotFoundError):
            DJNormalizer(recipe_path=missing)
    else:  # the reference documents RuntimeError for a missing data_juicer
        with pytest.raises((FileNotFoundError, RuntimeError)):
            DJNormalizer(recipe_path=missing)
