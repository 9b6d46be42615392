"""API reference §9, `composer_replication.hint_generator`: `HintContext`, `HINT_TEMPLATES`,
`dispatch`, `register`."""

from __future__ import annotations

import importlib

import pytest

from ._helpers import check_signature, check_typeddict, sig_id

# §9 hint_generator
SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        "composer_replication.hint_generator",
        "dispatch",
        "def dispatch(error_kind: str, ctx: HintContext | None = None) -> str | None",
        "def",
    ),
    (
        "composer_replication.hint_generator",
        "register",
        "def register(error_kind: str, fn: Callable[[HintContext], str]) -> None",
        "def",
    ),
] + [
    ("composer_replication.hint_generator", f"hint_{k}", f"def hint_{k}(ctx) -> str", "def")
    for k in ("tool_not_found", "json_decode", "type_error", "runtime_error", "repeated_failure")
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


TYPEDDICTS: list[tuple[str, str, str]] = [
    (
        "composer_replication.hint_generator",
        "HintContext",
        """
        class HintContext(TypedDict, total=False):
         error_kind: str
         error_message: str
         available_tools: list[str]
         tool_name: str
         tool_schema: dict
         intent: str
        """,
    ),
]


@pytest.mark.parametrize("row", TYPEDDICTS, ids=lambda r: r[1])
def test_typeddict_keys(row):
    check_typeddict(row)


MODULES = [
    "composer_replication.hint_generator",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_hint_templates_and_dispatch():
    from composer_replication import hint_generator as hg

    kinds = ("tool_not_found", "json_decode", "type_error", "runtime_error", "repeated_failure")
    assert set(kinds) <= set(hg.HINT_TEMPLATES), sorted(hg.HINT_TEMPLATES)
    for kind in kinds:
        fn = hg.HINT_TEMPLATES[kind]
        assert fn is getattr(hg, f"hint_{kind}")
        text = hg.dispatch(kind)
        assert isinstance(text, str) and text, kind
    assert hg.dispatch("no_such_error_kind_for_api_test") is None
    hg.register("api_surface_test_kind", lambda ctx: "Reminder: try X.")
    try:
        assert hg.dispatch("api_surface_test_kind") == "Reminder: try X."
    finally:
        hg.HINT_TEMPLATES.pop("api_surface_test_kind", None)
