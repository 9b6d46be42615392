"""API key lookup: the argument, then the environment, then a ``.env`` file in the working directory.

Keys are held in memory only: never logged, never written to the cache, ledger or any output.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_KEY_ENV = "OPENROUTER_API_KEY"


def _read_dotenv(path: Path, name: str) -> str | None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return None
    for line in lines:
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        if k.strip() == name:
            v = v.strip()
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                v = v[1:-1]
            return v or None
    return None


def resolve_api_key(explicit: str | None = None, env_name: str = DEFAULT_KEY_ENV) -> str | None:
    """``explicit`` → ``$env_name`` → ``env_name=...`` in ``./.env``; None if none is found."""
    if explicit:
        return explicit
    value = os.environ.get(env_name)
    if value:
        return value
    return _read_dotenv(Path.cwd() / ".env", env_name)
