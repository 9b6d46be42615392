#!/usr/bin/env python3
"""Print the configuration reference (docs/configuration.md) generated from the config models.

    python3 scripts/gen_config_docs.py > docs/configuration.md

Covers the run config (``composer_replication.config.RunConfig``, read by
``composer-replication run``), which embeds the trainer's ``TrainConfig`` under ``train``. A test checks
that the committed file equals this script's output.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def _type_name(t: Any) -> str:
    origin = typing.get_origin(t)
    if origin is typing.Literal:
        return " | ".join(f"`{json.dumps(a)}`" for a in typing.get_args(t))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(t))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(t))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if t is type(None):
        return "null"
    if isinstance(t, type) and issubclass(t, BaseModel):
        return "section"
    return getattr(t, "__name__", str(t))


def _nested_model(t: Any) -> type[BaseModel] | None:
    if isinstance(t, type) and issubclass(t, BaseModel):
        return t
    for a in typing.get_args(t):
        m = _nested_model(a)
        if m is not None and typing.get_origin(t) is not list:
            return m
    return None


def _variants(t: Any) -> list[type[BaseModel]]:
    """The models of a union chosen by ``type`` (``sdpo: {type: taid, ...}``); [] for anything else."""
    models = [a for a in typing.get_args(t) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models if len(models) > 1 and all("type" in m.model_fields for m in models) else []


def _variant_name(model: type[BaseModel]) -> str:
    return str(typing.get_args(model.model_fields["type"].annotation)[0])


def _default(field: Any) -> str:
    if field.default is not PydanticUndefined:
        v = field.default
    elif field.default_factory is not None:
        v = field.default_factory()
    else:
        return "**required**"
    return f"default `{json.dumps(v, default=str)}`"


def _constraints(field: Any) -> str:
    out = []
    for m in field.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
    return ", ".join(out)


def _anchor(key: str) -> str:
    return key.replace(".", "").replace("[]", "")


def _one_line(text: str | None) -> str:
    return " ".join(line.strip() for line in (text or "").strip().splitlines())


def _same(a: Any, b: Any) -> bool:
    return (a.annotation, a.description, _default(a), _constraints(a)) == (
        b.annotation,
        b.description,
        _default(b),
        _constraints(b),
    )


def _common(models: list[type[BaseModel]]) -> dict[str, Any]:
    """The fields every variant of a union has alike (listed once, in the union's own section)."""
    first = models[0].model_fields
    return {
        n: f
        for n, f in first.items()
        if n != "type" and all(n in m.model_fields and _same(m.model_fields[n], f) for m in models[1:])
    }


def _section(
    model: type[BaseModel],
    path: str,
    out: list[str],
    seen: set[str],
    variant: str = "",
    lead: str = "",
    fields: dict[str, Any] | None = None,
) -> None:
    """One section: its heading, what it is, one line per key, then the sections it holds."""
    title = f"`{path}`" + (f" with `type: {variant}`" if variant else "")
    out.append(f"## {title}" if path else "## Top level")
    doc = " ".join(x for x in (lead, "" if fields is not None else _one_line(model.__doc__)) if x)
    if doc:
        out.append(doc)
    nested: list[tuple[str, type[BaseModel], str]] = []
    list_items: list[tuple[str, type[BaseModel]]] = []
    variants: list[tuple[str, list[type[BaseModel]], list[str]]] = []
    skip = set(_common([model, *_variants_of.get(path, [])])) if variant else set()
    for name, f in (fields if fields is not None else model.model_fields).items():
        if variant and (name == "type" or name in skip):
            continue  # in the heading, or in the union's own section
        sub = _nested_model(f.annotation)
        key = f"{path}.{name}" if path else name
        desc = _one_line(f.description)
        if _variants(f.annotation):
            names = [_variant_name(m) for m in _variants(f.annotation)]
            variants.append((key, _variants(f.annotation), names))
            links = ", ".join(f"[`{n}`](#{_anchor(key)}-with-type-{n})" for n in names)
            default = _variant_name(type(f.default_factory()))
            out.append(
                f"- `{name}` (section; default `type: {default}`): {desc}; the fields of each: {links}"
            )
            continue
        if sub is not None:
            nested.append((key, sub, desc))
            continue
        if typing.get_origin(f.annotation) is list and any(
            _nested_model(a) for a in typing.get_args(f.annotation)
        ):
            item = next(_nested_model(a) for a in typing.get_args(f.annotation) if _nested_model(a))
            list_items.append((f"{key}[]", item))
            desc += f" Each item: see [`{key}[]`](#{_anchor(key)})."
        spec = "; ".join(x for x in (_type_name(f.annotation), _default(f), _constraints(f)) if x)
        out.append(f"- `{name}` ({spec}): {desc}".rstrip(": ").rstrip())
    if nested and not path:  # a table of contents at the top; nested sections follow their parent
        out.append("- Sections: " + ", ".join(f"[`{k}`](#{_anchor(k)})" for k, _, _ in nested))
    out.append("")
    for key, sub, desc in nested:
        if key not in seen:  # a section shared by variants is listed once
            seen.add(key)
            _section(sub, key, out, seen, lead=desc)
    for key, sub in list_items:
        if key not in seen:
            seen.add(key)
            _section(sub, key, out, seen)
    for key, models, names in variants:
        common = _common(models)
        _variants_of[key] = models
        links = ", ".join(f"[`{n}`](#{_anchor(key)}-with-type-{n})" for n in names)
        _section(models[0], key, out, seen, lead=f"The keys every `type` has ({links}).", fields=common)
        for sub, name in zip(models, names):
            back = f"Also the keys of [`{key}`](#{_anchor(key)})." if common else ""
            _section(sub, key, out, seen, variant=name, lead=back)


_variants_of: dict[str, list[type[BaseModel]]] = {}


def main() -> int:
    from composer_replication.config import RunConfig

    out = [
        "# Configuration reference",
        "",
        "<!-- generated by scripts/gen_config_docs.py from the config models; do not edit by hand:",
        "     python3 scripts/gen_config_docs.py > docs/configuration.md -->",
        "",
        "The file given to `composer-replication run CONFIG` (YAML, TOML or JSON). Unknown keys and values out of",
        "bounds fail when the file loads, naming the file and the field; relative paths resolve against its",
        "directory; `--set KEY=VALUE` overrides one field. Examples: `examples/cpu.yaml`, `examples/gpu.yaml`,",
        "`examples/diloco_modal.yaml`, `src/composer_replication/data/demo.yaml`. Each key: `name` (type; default; bounds).",
        "",
    ]
    _section(RunConfig, "", out, set())
    sys.stdout.write("\n".join(out).rstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
