"""API key lookup: the argument, then the environment, then a ``.env`` file in the working directory.

Keys are held in memory only: never logged, never written to the cache, ledger or any output; text
that came from a server passes through :class:`KeyScrubber` before it is logged, raised or written,
which replaces every key that `could_be_secret` (placeholders such as ``EMPTY`` stay in the text).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
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
MIN_SECRET_LEN = 16
MIN_SECRET_BITS = 64.0


def could_be_secret(key: str) -> bool:
    """True when ``key`` could be a secret: at least ``MIN_SECRET_LEN`` (16) characters and at least
    ``MIN_SECRET_BITS`` (64) bits of character entropy (its length times the Shannon entropy of its
    characters, the usual secret-scanner estimate).

    Every key a provider issues passes (OpenRouter's ``sk-or-v1-`` + 64 hex digits has ~290 bits); the
    placeholders local servers take (``EMPTY``, ``ollama``, ``a``, ``token-abc123``,
    ``sk-no-key-required``) and repetitive values do not: they are no secret, and scrubbing them would
    cut ordinary words out of teacher answers.
    """
    if len(key) < MIN_SECRET_LEN:
        return False
    n = len(key)
    entropy = -sum(c / n * math.log2(c / n) for c in Counter(key).values())
    return n * entropy >= MIN_SECRET_BITS


class KeyScrubber:
    """Replace every known API key in a text before it is logged, raised or written.

    A server may echo the request (the ``Authorization`` header, the whole request) in an error
    message or in a completion. Each key that `could_be_secret` is replaced in its plain form (which
    also covers ``Bearer <key>``), its JSON-escaped form and its URL-encoded form; a placeholder key
    (``EMPTY``, ``ollama``) is left in the text. Keys are matched literally: a key the server
    transforms further (base64, split across fields) is not recognised.
    """

    def __init__(self, keys: Iterable[str | None] = ()) -> None:
        self._forms: list[str] = []
        for k in keys:
            self.add(k)

    def add(self, key: str | None) -> None:
        if not key or not could_be_secret(key):
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
