"""Shared checks of the API-surface tests (tests/api/): one file per section of the API reference
(``/work/shared/spec/api_reference.md``: §1–§12, and §13–§17 by module), read side by side with it.

Every expected signature below is the reference's own text, pasted as a stub and compiled with
postponed annotations (so annotations are never evaluated) in the namespace of the module under test
(so a default such as ``SYSTEM_PROMPT`` or ``tuple(DEFAULT_TEACHERS)`` means that module's value).
Read the tables side by side with the reference.

Rule (reference: "improve behind it, never break it"): parameter names, kinds, order and defaults must
match exactly; the only extras allowed are trailing keyword-only parameters that have defaults.
Dataclass / TypedDict fields: the reference's fields in order with their defaults; extra dataclass
fields must come last and have defaults; extra TypedDict keys must be optional.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
import typing
from dataclasses import MISSING

P = inspect.Parameter
# Postponed annotations for the stubs: the reference's type hints are text, never evaluated.
_FUTURE = importlib.import_module("__future__").annotations.compiler_flag

# ---------------------------------------------------------------------------------------------------
# Helpers: compile a stub from the reference, compare.
# ---------------------------------------------------------------------------------------------------


def _stub_namespace(module) -> dict:
    ns = dict(vars(module))
    ns.update(
        {
            "dataclass": dataclasses.dataclass,
            "field": dataclasses.field,
            "TypedDict": typing.TypedDict,
            "ClassVar": typing.ClassVar,
            "Protocol": typing.Protocol,
        }
    )
    return ns


def compile_stub(module, source: str):
    """Exec ``source`` (one ``def`` or ``class``) in ``module``'s namespace; return the object."""
    source = textwrap.dedent(source).strip()
    if source.startswith(("def ", "async def ")) and not source.rstrip().endswith(":"):
        source += ": ..."
    ns = _stub_namespace(module)
    code = compile(source, "<api_reference stub>", "exec", flags=_FUTURE, dont_inherit=True)
    exec(code, ns)
    return ns[ast.parse(source).body[0].name]


def _resolve(module_name: str, qualname: str):
    module = importlib.import_module(module_name)
    obj = module
    for part in qualname.split("."):
        assert hasattr(obj, part), f"{module_name}.{qualname}: {part!r} is missing"
        obj = getattr(obj, part)
    return module, obj


def _fmt(p: inspect.Parameter) -> str:
    return str(p.replace(annotation=P.empty))


def _sig_str(params) -> str:
    return "(" + ", ".join(_fmt(p) for p in params) + ")"


def _defaults_equal(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, bool) or isinstance(b, bool):  # True == 1, but not the same default
        return type(a) is type(b) and a == b
    try:
        return bool(a == b)
    except Exception:  # e.g. an ambiguous tensor comparison
        return False


def signature_problems(actual: inspect.Signature, expected: inspect.Signature) -> list[str]:
    exp = list(expected.parameters.values())
    act = list(actual.parameters.values())
    problems: list[str] = []
    exp_kw = exp.pop() if exp and exp[-1].kind is P.VAR_KEYWORD else None
    act_kw = act.pop() if act and act[-1].kind is P.VAR_KEYWORD else None
    if exp_kw is not None and act_kw is None:
        problems.append(f"missing **{exp_kw.name}")
    if act_kw is not None and exp_kw is None:
        problems.append(f"extra **{act_kw.name} (not in the reference)")
    for i, e in enumerate(exp):
        if i >= len(act):
            problems.append(f"missing parameter {_fmt(e)!r}")
            continue
        a = act[i]
        if e.kind is P.VAR_POSITIONAL and a.kind is P.VAR_POSITIONAL:
            continue
        if a.name != e.name or a.kind is not e.kind:
            problems.append(
                f"parameter {i}: expected {_fmt(e)!r} ({e.kind.description}), "
                f"got {_fmt(a)!r} ({a.kind.description})"
            )
        elif not _defaults_equal(a.default, e.default):
            problems.append(f"parameter {e.name!r}: default expected {e.default!r}, got {a.default!r}")
    for a in act[len(exp) :]:
        if a.kind is not P.KEYWORD_ONLY or a.default is P.empty:
            problems.append(
                f"extra parameter {_fmt(a)!r} ({a.kind.description}): only trailing keyword-only "
                "parameters with defaults may be added"
            )
    if problems:
        problems.append(f"expected {_sig_str(expected.parameters.values())}")
        problems.append(f"actual   {_sig_str(actual.parameters.values())}")
    return problems


def sig_id(row) -> str:
    return f"{row[0].removeprefix('composer_replication.')}:{row[1]}"


def check_signature(row) -> None:
    """A callable's row ``(module, qualname, reference text, kind)``; kind: "def" | "async" | "static"."""
    module_name, qualname, reference, kind = row
    module, obj = _resolve(module_name, qualname)
    stub = compile_stub(module, reference)
    problems = signature_problems(inspect.signature(obj), inspect.signature(stub))
    if kind == "async":
        if not inspect.iscoroutinefunction(obj):
            problems.append("must be an `async def` (the reference awaits it)")
    if kind == "static":
        owner_name, attr = qualname.rsplit(".", 1)
        _, owner = _resolve(module_name, owner_name)
        if not isinstance(inspect.getattr_static(owner, attr), staticmethod):
            problems.append("must be a @staticmethod")
    assert not problems, f"{module_name}.{qualname}:\n  " + "\n  ".join(problems)


def _field_default(f: dataclasses.Field):
    if f.default is not MISSING:
        return ("value", f.default)
    if f.default_factory is not MISSING:
        return ("factory ->", f.default_factory())
    return ("required", None)


def check_dataclass(row) -> None:
    """A dataclass's row ``(module, name, reference text)``."""
    module_name, name, reference = row
    module, actual = _resolve(module_name, name)
    expected = compile_stub(module, reference)
    assert dataclasses.is_dataclass(actual), f"{module_name}.{name} must be a dataclass"
    exp = [(f.name, _field_default(f)) for f in dataclasses.fields(expected) if f.init]
    act_fields = [f for f in dataclasses.fields(actual) if f.init]
    act = [(f.name, _field_default(f)) for f in act_fields]
    problems = []
    if act[: len(exp)] != exp:
        problems.append(f"fields expected {exp}\n    got {act[: len(exp)]}")
    for f in act_fields[len(exp) :]:
        if _field_default(f)[0] == "required":
            problems.append(f"extra field {f.name!r} has no default (breaks positional construction)")
    assert not problems, f"{module_name}.{name}:\n  " + "\n  ".join(problems)


def check_typeddict(row) -> None:
    """A TypedDict's row ``(module, name, reference text)``."""
    module_name, name, reference = row
    module, actual = _resolve(module_name, name)
    expected = compile_stub(module, reference)
    assert typing.is_typeddict(actual), f"{module_name}.{name} must be a TypedDict"
    exp_keys = list(expected.__annotations__)
    act_keys = list(actual.__annotations__)
    problems = []
    if act_keys[: len(exp_keys)] != exp_keys:
        problems.append(f"keys expected {exp_keys}, got {act_keys}")
    if set(actual.__required_keys__) != set(expected.__required_keys__):
        problems.append(
            f"required keys expected {sorted(expected.__required_keys__)}, "
            f"got {sorted(actual.__required_keys__)}"
        )
    assert not problems, f"{module_name}.{name}:\n  " + "\n  ".join(problems)


def check_same_object(row) -> None:
    """``(where, name, source)``: the same object from each module the reference imports it from."""
    where, name, source = row
    a = getattr(importlib.import_module(where), name, None)
    b = getattr(importlib.import_module(source), name, None)
    assert a is not None, f"{where}.{name} is missing"
    assert a is b, f"{where}.{name} is not {source}.{name}"
