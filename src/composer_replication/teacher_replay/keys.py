"""API key lookup: the argument, then the environment, then a ``.env`` file in the working directory.

Keys are held in memory only: never logged, never written to the cache, ledger or any output; text
that came from a server passes through :class:`KeyScrubber` before it is logged, raised or written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

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


REDACTED_KEY = "[REDACTED-API-KEY]"


class KeyScrubber:
    """Replace every known API key in a text before it is logged, raised or written.

    A server may echo the request (the ``Authorization`` header, the whole request) in an error
    message or in a completion. Each key is replaced in its plain form (which also covers
    ``Bearer <key>``), its JSON-escaped form and its URL-encoded form. Keys are matched literally: a
    key the server transforms further (base64, split across fields) is not recognised.
    """

    def __init__(self, keys: Iterable[str | None] = ()) -> None:
        self._forms: list[str] = []
        for k in keys:
            self.add(k)

    def add(self, key: str | None) -> None:
        if not key:
            return
        forms = {key, json.dumps(key)[1:-1], quote(key, safe="")}
        self._forms = sorted(set(self._forms) | forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED_KEY)
        return text

    def __bool__(self) -> bool:
        return bool(self._forms)
