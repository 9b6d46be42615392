"""The environment a repository's checks need, prepared once (outside the sandbox) and cached.

What runs where:

- **Here, at mining time, outside the sandbox, with the network**: reading the dependency declarations
  (``requirements*.txt``, ``pyproject.toml`` ``[project] dependencies`` and its ``test``/``tests``/``dev``
  extras and dependency groups) — text only, nothing of the repository is executed (``setup.py`` is never
  run) — and, for the declared packages the sandbox's Python lacks, ``python3 -m pip install --target
  CACHE/site PACKAGES``: packages from the package registry (their build steps run here, as a user
  installing them would), never the repository itself.
- **Cached** under ``CACHE = ~/.cache/composer-replication/task-envs/<key>`` where the key is a digest of
  the package list and the Python version: every repository and commit that declares the same packages
  shares it; a failed build is cached too (``failed`` with its log) and not retried until the declarations
  change or the cache is removed.
- **In the sandbox, without the network**: the checks. The sandbox's Python is the host interpreter
  (mounted read-only); ``CACHE/site`` is mounted read-only at ``/opt/task-env/site`` and put on
  ``PYTHONPATH``.

Node, Go, Rust and Elixir projects get a recipe in the task's ``environment/Dockerfile`` but nothing is
installed here: their checks run only where the sandbox already has the toolchain and dependencies.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SANDBOX_ENV = "/opt/task-env"
_REQ_FILES = re.compile(
    r"^(requirements|dev-requirements|test-requirements)[\w.-]*\.txt$|^requirements/.*\.txt$"
)
_EXTRAS = ("test", "tests", "testing", "dev")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass
class Environment:
    kind: str  # "python" | "node" | "go" | "rust" | "elixir" | "none"
    packages: list[str] = field(default_factory=list)  # declared requirements the sandbox lacks
    site: str = ""  # the prepared site-packages on this machine ("" when nothing was installed)
    error: str = ""  # why it could not be prepared ("" when it could)

    def recipe(self) -> dict[str, object]:
        """The ``[environment]`` table of ``task.toml`` (no machine paths)."""
        install = [f"python3 -m pip install {' '.join(self.packages)}"] if self.packages else []
        if self.kind == "node":
            install = ["npm ci --ignore-scripts"]
        return {"kind": self.kind, "packages": self.packages, "install": install}


def detect(files: dict[str, bytes]) -> Environment:
    """The kind of project and the declared Python packages that the sandbox's Python lacks."""
    if "package.json" in files:
        return Environment("node")
    for marker, kind in (("go.mod", "go"), ("Cargo.toml", "rust"), ("mix.exs", "elixir")):
        if marker in files:
            return Environment(kind)
    reqs: list[str] = []
    for path, data in sorted(files.items()):
        if _REQ_FILES.search(path):
            reqs += _requirement_lines(data.decode("utf-8", "replace"))
    if "pyproject.toml" in files:
        reqs += _pyproject(files["pyproject.toml"])
    if not reqs and not any(p.endswith(".py") for p in files):
        return Environment("none")
    missing = [r for r in dict.fromkeys(reqs) if not _installed(r)]
    return Environment("python", missing)


def _requirement_lines(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-", ".", "/")) and "://" not in line and _NAME.match(line):
            out.append(line)
    return out


def _pyproject(data: bytes) -> list[str]:
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return []
    project: dict[str, Any] = doc["project"] if isinstance(doc.get("project"), dict) else {}
    out = [d for d in project.get("dependencies", []) if isinstance(d, str)]
    extras = project.get("optional-dependencies", {})
    groups = doc.get("dependency-groups", {})
    for table in (extras, groups):
        if isinstance(table, dict):
            for key in _EXTRAS:
                out += [d for d in table.get(key, []) if isinstance(d, str)]
    return out


def _installed(requirement: str) -> bool:
    m = _NAME.match(requirement)
    if not m:
        return True
    try:
        importlib.metadata.distribution(m.group(1))
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def default_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "composer-replication" / "task-envs"


def _key(packages: list[str]) -> str:
    return hashlib.sha256(json.dumps([list(sys.version_info[:2]), packages]).encode()).hexdigest()[:20]


def from_recipe(recipe: Any) -> Environment:
    """The environment a task's ``[environment]`` table describes (to prepare it again, or find it)."""
    kind = recipe.get("kind", "none") if isinstance(recipe, dict) else "none"
    pkgs = recipe.get("packages", []) if isinstance(recipe, dict) else []
    return Environment(str(kind), [p for p in pkgs if isinstance(p, str)] if isinstance(pkgs, list) else [])


def task_env(env: Environment) -> dict[str, str]:
    """The variables a task's checks run with for this environment."""
    return {"PYTHONPATH": f"{SANDBOX_ENV}/site"} if env.packages else {}


def sandbox_spec(env: Environment, sandbox: Any) -> Any:
    """What to give the verifier as ``sandbox``: ``sandbox`` itself, or a factory mounting ``env.site``."""
    if not env.site:
        return sandbox
    from composer_replication.datagen.sandbox import make_sandbox

    if callable(sandbox):
        raise ValueError("a sandbox factory cannot be combined with a prepared task environment")
    binds = {env.site: f"{SANDBOX_ENV}/site"}
    return lambda: make_sandbox(sandbox, ro_binds=binds)


def prepare(
    env: Environment, cache: Path, *, pip_args: list[str] | None = None, timeout_s: float = 900
) -> None:
    """Install ``env.packages`` into ``cache/<key>/site`` (once; see module docstring); sets ``env.site``
    or ``env.error``. ``pip_args`` are extra ``pip install`` options (``--no-index --find-links DIR``)."""
    if env.kind != "python" or not env.packages:
        return
    key = hashlib.sha256(
        json.dumps([sys.version_info[:2], env.packages, pip_args or []]).encode()
    ).hexdigest()[:20]
    home = cache / key
    if (home / "ok").exists():
        env.site = str(home / "site")
        return
    if (home / "failed").exists():
        env.error = (home / "failed").read_text(encoding="utf-8", errors="replace").strip()
        return
    home.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    argv += ["--target", str(home / "site.tmp"), *(pip_args or []), *env.packages]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        ok, log = r.returncode == 0, (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired:
        ok, log = False, f"pip install ran past {timeout_s:.0f} s"
    (home / "log.txt").write_text(log + "\n", encoding="utf-8")
    if not ok:
        last = log.splitlines()[-1] if log else "no output"
        env.error = f"environment build failed: pip install {' '.join(env.packages)[:120]}: {last[:200]}"
        (home / "failed").write_text(env.error + "\n", encoding="utf-8")
        return
    for d, _dirs, files in os.walk(home / "site.tmp"):  # the sandbox user reads it
        os.chmod(d, 0o755)
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o444)
    os.replace(home / "site.tmp", home / "site")
    (home / "ok").write_text("\n", encoding="utf-8")
    env.site = str(home / "site")
