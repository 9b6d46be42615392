"""What every config tree shares: the strict base model, the one loader and the one error type.

``StrictModel`` rejects unknown keys and validates on assignment. ``load_file(path, model, ...)`` reads
YAML, TOML or JSON, applies dotted overrides (``schedule.max_steps=3``) and validates; every failure is
a ``ConfigError`` whose message names the file and each bad field, one line each. Importable without
torch: the CLI checks a config before any model loads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from difflib import get_close_matches
from pathlib import Path
from typing import Any, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "ConfigError",
    "StrictModel",
    "check_base_url",
    "format_validation_error",
    "load_file",
    "read_config_data",
    "read_config_file",
    "set_dotted",
    "validate",
]

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config that does not validate; the message names the file and each bad field."""


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated, and no number is
    infinite or NaN (``1e400`` reads as infinity: a loss weight or a dollar cap of inf is never meant)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def check_base_url(url: str, who: str = "base_url") -> str:
    """``url`` without a trailing slash if it is an ``http(s)://host...`` URL; ``ValueError`` otherwise."""
    parts = urlsplit(str(url))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{who} {url!r}: expected an http:// or https:// server root such as http://127.0.0.1:8000/v1 "
            "(other schemes, file:// included, are refused)"
        )
    return str(url).rstrip("/")


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML, TOML or JSON file; ``ConfigError`` for another suffix, a syntax error
    (with the parser's line) or a top level that is not a mapping."""
    data = read_config_data(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def read_config_data(path: Path) -> Any:
    """What a YAML, TOML or JSON file holds, any top level (an empty YAML file is ``{}``); ``ConfigError``
    naming the file for another suffix or a syntax error (with the parser's line)."""
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            kind = "YAML"
            data = yaml.safe_load(text)
            data = {} if data is None else data
        elif suffix == ".toml":
            import tomllib

            kind = "TOML"
            data = tomllib.loads(text)
        elif suffix == ".json":
            kind = "JSON"
            data = json.loads(text)
        else:
            raise ConfigError(f"{path}: unknown config format {suffix!r}; use .yaml, .toml or .json")
    except ConfigError:
        raise
    except Exception as exc:  # yaml.YAMLError, tomllib.TOMLDecodeError, json.JSONDecodeError
        detail = " ".join(str(exc).split())
        raise ConfigError(f"{path}: not valid {kind}: {detail}") from None
    return data


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """``data["a"]["b"]["c"] = value`` for ``"a.b.c"``, creating sections; ``ConfigError`` when a part
    on the way (``a.b``) already holds a value rather than a section."""
    node = data
    *parents, leaf = dotted.split(".")
    for i, key in enumerate(parents):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            where = ".".join(parents[: i + 1])
            raise ConfigError(
                f"{dotted}: {where} is a value ({node!r}), not a section, so it has no field "
                f"{(parents + [leaf])[i + 1]!r}; set {where}=VALUE instead"
            )
    node[leaf] = value


def _dotted(loc: tuple[int | str, ...], data: Any) -> str:
    """``loc`` as the dotted key the user writes: pydantic puts the variant's tag of a union chosen by
    ``type`` in the location (``loss.sdpo.taid.t_start``); a tag that is not a key of the input is dropped."""
    parts: list[str] = []
    node = data
    for i, p in enumerate(loc):
        is_tag = isinstance(node, dict) and p not in node and i < len(loc) - 1
        if is_tag and node.get("type", p) == p:
            continue
        parts.append(str(p))
        if isinstance(node, dict):
            node = node.get(p)
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            node = node[p]
        else:
            node = None
    return ".".join(parts)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The model classes a field's annotation can hold (through unions, ``Annotated``, lists and dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> set[str]:
    """The field names a mapping at ``loc`` of ``model`` may hold (empty when unknown). A part of ``loc``
    that names no field is a union's tag (pydantic puts it in the location): it picks the variant whose
    ``type`` accepts it."""
    models = [model]
    for part in loc:
        if isinstance(part, int):
            continue  # a list index: the element's model is already in ``models``
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        if fields:
            models = [x for f in fields for x in _models_in(f.annotation)]
        else:
            models = [
                m for m in models if part in get_args(getattr(m.model_fields.get("type"), "annotation", None))
            ]
    return {k for m in models for k in m.model_fields}


def _unknown_key(loc: tuple[int | str, ...], where: str, model: type[BaseModel] | None, docs: str) -> str:
    """``unknown key 'X' in SECTION; did you mean 'Y'?`` (the nearest key of that section), else where
    the fields are listed."""
    key, section = str(loc[-1]) if loc else "", where.rpartition(".")[0]
    keys = sorted(_keys_at(model, loc[:-1])) if model else []
    near = get_close_matches(key, keys, n=1, cutoff=0.6)
    initials = "".join(w[:1] for w in key.split("_"))  # learning_rate -> lr
    if not near and "_" in key and initials in keys:
        near = [initials]
    where_ = f"in {section}" if section else "at the top level"
    if near:
        return f"unknown key {key!r} {where_}; did you mean {near[0]!r}? (fields: {docs})"
    return f"unknown key {key!r} {where_} (check the spelling; see {docs} for the fields)"


def format_validation_error(
    exc: ValidationError,
    source: str,
    *,
    docs: str = "docs/training.md",
    data: Any = None,
    model: type[BaseModel] | None = None,
) -> str:
    """One line per bad field, each naming its dotted location; ``docs`` is where the fields are listed;
    ``data``, the validated input, lets a union's tag be left out of the location; ``model``, the model
    validated against, names the nearest key for a misspelt one."""
    lines = [f"{source}: invalid config ({exc.error_count()} error(s)):"]
    for err in exc.errors():
        if isinstance(data, dict):
            loc = _dotted(err["loc"], data) or "(top level)"
        else:
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = _unknown_key(err["loc"], loc, model, docs)
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def validate(model: type[M], data: Mapping[str, Any], *, source: str, docs: str) -> M:
    """``model.model_validate(data)``; ``ConfigError`` naming ``source`` and each bad field."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, docs=docs, data=data, model=model)) from None


def load_file(
    path: str | Path,
    model: type[M],
    overrides: Mapping[str, Any] | None = None,
    *,
    docs: str,
    prepare: Callable[[dict[str, Any], Path], None] | None = None,
) -> M:
    """The one loader: read ``path`` (YAML/TOML/JSON), apply ``overrides`` (dotted keys), let ``prepare``
    rewrite the mapping in place (e.g. resolve relative paths against the file's directory, passed as
    its second argument), and validate into ``model``.

    Raises ``FileNotFoundError`` for a missing file and ``ConfigError`` (naming the file and the field)
    for everything else.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    data = read_config_file(path)
    for dotted, value in (overrides or {}).items():
        try:
            set_dotted(data, dotted, value)
        except ConfigError as exc:
            raise ConfigError(f"{path}: override {exc}") from None
    if prepare is not None:
        prepare(data, path.resolve().parent)
    return validate(model, data, source=str(path), docs=docs)
