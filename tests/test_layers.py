"""The package's shape, measured on the source tree: layers, import cycles, module and function size.

Every ``import`` in ``src/composer_replication`` (lazy ones inside functions too) is read with ``ast``.
A module may import from its own layer or a lower one, never from a higher one, and the module graph has
no cycles. The layers (lowest first) are the ones docs/architecture.md draws.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "composer_replication"
PKG = "composer_replication"

# Top-level modules and packages of composer_replication, lowest layer first.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundation", {"", "_extras", "_io", "_lock", "config"}),
    ("primitives", {"kernels", "losses", "encoding", "wire", "tool_schemas", "models", "safety", "generation"}),
    ("losses", {"channels", "loss", "opsd", "distillation", "batch", "hint_generator"}),
    ("data", {"ingestion", "teacher_replay", "datagen"}),
    ("normalisation", {"replaysim"}),
    ("tasks", {"tasks"}),
    ("training", {"trainer"}),
    ("scale", {"diloco"}),
    ("orchestration", {"pipeline", "recipes"}),
    ("cli", {"cli"}),
]
LEVEL = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}
MAX_LINES = 400
MAX_FUNCTION_LINES = 80  # a def's lines, ``end_lineno - lineno + 1`` (decorators not counted)
# Functions allowed past MAX_FUNCTION_LINES: declared tables only (rows of data, no logic), each with why.
# Keep it short: a long function with logic is split, not listed.
LONG_TABLES = {
    "pipeline/stages.py:build_stages": "the pipeline's stage table: one Stage(...) row per stage, in run order",
}

# The rooms of ``trainer`` (its subpackages, and the modules beside them that the rooms share), lowest first.
# A trainer module imports from its own room or a lower one: the shared modules import no room, and no room
# imports one above it. ``composer_trainer`` is the GRPO room's trainer class at the API reference's path.
_SHARED = ("", "data_collator", "data", "prepare", "pair_tokens", "error_sites", "checkpoint", "export")
TRAINER_ROOMS: list[tuple[str, set[str]]] = [
    ("shared", {*_SHARED, "trackers", "plots"}),
    ("distributed", {"distributed"}),
    ("grpo", {"grpo", "composer_trainer"}),
    ("evaluation", {"evaluation"}),
    ("offline", {"offline"}),
]
ROOM_LEVEL = {name: i for i, (_, names) in enumerate(TRAINER_ROOMS) for name in names}


def _sources() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        rel = p.relative_to(SRC)
        if rel.parts[:2] == ("datagen", "tasks"):  # bundled task data (little repositories), not package code
            continue
        parts = [PKG, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from pkg import submodule`` counts as the submodule)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            edges[mod].update(t for t in targets if t in mods and t != mod)
    return edges


def _top(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else ""


def test_every_top_level_module_has_a_layer():
    tops = {_top(m) for m in _sources()}
    assert tops <= set(LEVEL), f"give these a layer in tests/test_layers.py: {sorted(tops - set(LEVEL))}"


def test_no_module_imports_from_a_higher_layer():
    edges = _graph(_sources())
    upward = sorted(
        f"{a} ({LAYERS[LEVEL[_top(a)]][0]}) imports {b} ({LAYERS[LEVEL[_top(b)]][0]})"
        for a, bs in edges.items()
        for b in bs
        if LEVEL.get(_top(b), 0) > LEVEL.get(_top(a), 0)
    )
    assert not upward, "\n".join(upward)


def _room(mod: str) -> str:
    """``composer_replication.trainer.offline.loop`` -> ``offline``; the package itself -> ``""``."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 else ""


def test_every_trainer_module_has_a_room():
    rooms = {_room(m) for m in _sources() if _top(m) == "trainer"}
    missing = sorted(rooms - ROOM_LEVEL.keys())
    assert not missing, f"give these a room in tests/test_layers.py: {missing}"


def test_no_trainer_room_imports_a_higher_one():
    edges = _graph(_sources())
    upward = sorted(
        f"{a} ({TRAINER_ROOMS[ROOM_LEVEL[_room(a)]][0]}) imports {b} ({TRAINER_ROOMS[ROOM_LEVEL[_room(b)]][0]})"
        for a, bs in edges.items()
        if _top(a) == "trainer"
        for b in bs
        if _top(b) == "trainer" and ROOM_LEVEL.get(_room(b), 0) > ROOM_LEVEL.get(_room(a), 0)
    )
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    edges = _graph(_sources())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                cycles.append(sorted([v, *comp]))

    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_lazy_relative_and_submodule_imports(tmp_path):
    """The graph reader itself: a cycle through a function-level relative import is found."""
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from p import a\nimport p.c\n")
    (pkg / "c.py").write_text("")
    mods = {"p": pkg / "__init__.py", "p.a": pkg / "a.py", "p.b": pkg / "b.py", "p.c": pkg / "c.py"}
    assert _graph(mods) == {"p": set(), "p.a": {"p.b"}, "p.b": {"p.a", "p.c"}, "p.c": set()}


def test_no_module_is_longer_than_the_cap():
    long = {
        str(p.relative_to(SRC)): n
        for p in _sources().values()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def _long_functions(path: Path, limit: int) -> dict[str, int]:
    """``qualified name -> lines`` of every function in ``path`` longer than ``limit`` (methods and nested
    functions included, named ``Class.method`` / ``outer.inner``)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                n = (child.end_lineno or child.lineno) - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and n > limit:
                    out[name] = n
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def test_no_function_is_longer_than_the_cap():
    long = {
        f"{p.relative_to(SRC)}:{name}": n
        for p in _sources().values()
        for name, n in _long_functions(p, MAX_FUNCTION_LINES).items()
    }
    unlisted = {k: n for k, n in long.items() if k not in LONG_TABLES}
    assert not unlisted, f"functions over {MAX_FUNCTION_LINES} lines (split them by meaning): {unlisted}"
    stale = sorted(set(LONG_TABLES) - set(long))
    assert not stale, f"LONG_TABLES lists functions that are gone or now short (drop them): {stale}"


def test_the_function_length_check_sees_methods_and_nested_functions(tmp_path):
    def fn(name: str, lines: int, indent: str = "") -> str:  # a function of exactly ``lines`` lines
        return f"{indent}def {name}():\n" + "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))

    src = "class C:\n" + fn("m", 81, "    ") + fn("short", 80) + "def outer():\n" + fn("inner", 81, "    ")
    (tmp_path / "m.py").write_text(src + "    return inner\n")
    found = _long_functions(tmp_path / "m.py", MAX_FUNCTION_LINES)
    assert found == {"C.m": 81, "outer": 83, "outer.inner": 81}  # the 80-line ``short`` passes


def test_spec_symbols_live_where_the_docs_say():
    """docs/architecture.md's table: each public path resolves, to the object defined in the named module."""
    import importlib
    import inspect
    import re

    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \|$", doc, flags=re.M)
    assert len(rows) >= 40, "the table of spec symbols is missing from docs/architecture.md"
    wrong = []
    for public, home in rows:
        module, _, name = public.rpartition(".")
        obj = getattr(importlib.import_module(module), name)
        if getattr(importlib.import_module(home), name, None) is not obj or (
            (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__ != home
        ):
            wrong.append(f"{public}: not defined in {home}")
    assert not wrong, "\n".join(wrong)
