"""The secret shapes :mod:`composer_replication.ingestion.redact` looks for, one finder per type.

A rule is ``(type, anchors, find)``: ``find(text, pos)`` is called where one of the rule's anchors starts
(``pos``) and returns the ``(start, end)`` span to replace, or ``None``. Anchors are short literal pieces of
the secret or of its name; the scanner finds them all in one pass, so text without anchors costs nothing
here. Base64-wrapped secrets and line continuations are handled by the scanner (redact.py), not here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from composer_replication.ingestion._redact_entropy import looks_random, wordy

Find = Callable[[str, int], "tuple[int, int] | None"]

_HEX = frozenset("0123456789abcdefABCDEF")


def boundary_ok(text: str, st: int) -> bool:
    """A secret may start at ``st``: after a non-word character, or right after an escape that ends in a
    letter or digit (``%3D`` URL encoding, ``\\n``/``\\t`` and ``\\u0022``/``\\x3d`` string escapes)."""
    if st == 0:
        return True
    c = text[st - 1]
    if not (c.isalnum() or c == "_"):
        return True
    if st >= 3 and text[st - 3] == "%" and c in _HEX and text[st - 2] in _HEX:
        return True
    if st >= 2 and text[st - 2] == "\\" and c in "nrtbfv0":
        return True
    if st >= 4 and text[st - 4 : st - 2] == "\\x" and c in _HEX and text[st - 3] in _HEX:
        return True
    return st >= 6 and text[st - 6 : st - 4] == "\\u" and all(ch in _HEX for ch in text[st - 4 : st])


def _regex(rx: str, *, group: int = 0, boundary: bool = True, back: int = 0) -> Find:
    """A finder that matches ``rx`` at the anchor (or up to ``back`` characters before it)."""
    pat = re.compile(rx)

    def find(text: str, pos: int) -> tuple[int, int] | None:
        for st in range(max(0, pos - back), pos + 1):
            if boundary and not boundary_ok(text, st):
                continue
            m = pat.match(text, st)
            if m is not None:
                return m.span(group)
        return None

    return find


# -- names with secret-looking values (.env, YAML, JSON, code, CLI flags, getenv defaults) --------------------

# Matched at the keyword (the part of the name an anchor finds); what precedes it (``GITHUB_`` in
# ``GITHUB_TOKEN``) is not needed. The name must end at the separator, so ``token_type``, ``tokenizer``,
# ``embed_tokens`` and ``secret_name`` are not names here.
_ENV_RX = re.compile(
    r"(?i)(?P<name>secret|passw(?:or)?d|passphrase|pwd|credentials?|token(?!s)|api[_\-]?key|access[_\-]?key"
    r"|private[_\-]?key|auth[_\-]?key)(?:[_\-]?(?:key|token))?(?:s(?![A-Za-z0-9]))?"
    r"(?P<q>\\?[\"'`])?[ \t]*"
    r"(?:(?P<sep>:=|=>|[:=])|(?P<comma>,)|(?P<space> ))[ \t]*"
    r"(?(comma)(?:default[ \t]*=[ \t]*)?)"
    r"(?:(?P<vq>\\?[\"'`])(?P<qv>[^\s\"'`\\]+)(?P=vq)|(?P<uv>[^\s\"'`\\]++))"
)
# Template / reference / placeholder values, never secrets.
_PLACEHOLDER_RX = re.compile(
    r"\$\{?\w|\{\{?|<[^>]*>|%\(|%s|\*{3}|x{4}|X{4}|\.\.\.|\[REDACTED|\w+://"
    r"|(?i:your|my[_\-]|example|dummy|fake|sample|changeme|change[_\-]me|placeholder|redacted|replace"
    r"|(?:test|none|null|undefined|true|false|secret|password|token)\W*$)"
)
_TOKEN_VALUE_RX = re.compile(r"[A-Za-z0-9_\-.~+/=:]+")
_CODE_RX = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?P<tail>[(\[]|$)")
_SYMBOLS = frozenset("!#$%^&*()+=~|?<>[]{};")


def _has_digit(s: str) -> bool:
    return any(c.isdigit() for c in s)


def _strip_code_tail(v: str) -> str:
    """``f(password=abc123)``: drop trailing separators and closers that close something outside the value."""
    v = v.rstrip(",;")
    for o, c in ("()", "[]", "{}"):
        while v.endswith(c) and v.count(c) > v.count(o):
            v = v[:-1].rstrip(",;")
    return v


def _path_like(v: str) -> bool:
    """``/run/secrets/db``, ``~/.aws/key``, ``./x``: a path, not a secret; a base64 value that starts with ``/``
    (1 in 64 do) has ``+`` or ``=`` or a random-looking piece between its slashes."""
    body = v.lstrip("~.")
    if len(v) - len(body) > 2 or not body.startswith("/") or "+" in v or v.endswith("="):
        return False
    return not any(len(p) >= 12 and looks_random(p) for p in body.split("/"))


def _env_value_ok(
    kind: str, keyword: str, v: str, quoted: bool, name_quoted: bool, env_line: bool = False
) -> bool:
    """Does ``v`` look like a secret value of a ``kind`` (``token``/``password``) name? (See docs/ingestion.md.)
    ``env_line``: ``NAME=value`` in an environment file or shell (upper-case name, no spaces): a password
    of letters only counts there."""
    if len(v) < (6 if quoted and kind == "password" else 8) or _PLACEHOLDER_RX.match(v) or _path_like(v):
        return False
    if not quoted and v[0] in "([{":
        return False  # an expression: ``pwd = (self.password.encode() ...``
    if kind == "token":  # tokens and keys: a token alphabet (special tokens such as "<mask>" fail here)
        if not _TOKEN_VALUE_RX.fullmatch(v) or v.isdigit():
            return False
        if not (_has_digit(v) and any(c.isalpha() for c in v)) and not (
            len(v) >= 20 and any(c.isupper() for c in v) and any(c.islower() for c in v)
        ):
            return False
    elif not quoted and not env_line and not _has_digit(v) and not any(c in _SYMBOLS for c in v):
        return False
    if quoted:
        return True
    m = _CODE_RX.match(v)
    # An expression, not a literal: ``name.attr``, ``f(...)``, ``x[...]``, a variable as a dict value, or a
    # keyword argument passed on (``mask2_token=mask2_token``).
    return m is None or not (m.group("tail") or "." in v or name_quoted or keyword in v.lower())


def _call_arg(text: str, pos: int, quote: str) -> bool:
    """The quoted name around ``pos`` is a call's first argument: ``getenv("DB_PASSWORD", ...``."""
    i = pos
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_-."):
        i -= 1
    j = i - len(quote)
    return j >= 0 and text[j:i] == quote and text[max(0, j - 16) : j].rstrip(" ").endswith("(")


def _env_find(text: str, pos: int) -> tuple[int, int] | None:
    m = _ENV_RX.match(text, pos)
    if m is None:
        return None
    name = m.group("name").lower()
    kind = "token" if name.startswith(("token", "api", "access", "private", "auth")) else "password"
    quoted = m.group("qv") is not None
    if m.group("comma") is not None and not (m.group("q") and quoted and _call_arg(text, pos, m.group("q"))):
        return None  # getenv("NAME", "default") form only
    if m.group("space") is not None:
        # ``--password VALUE``: only as a command-line flag.
        before = text[max(0, pos - 64) : pos]  # the flag, up to the keyword
        if m.group("q") or not before or before[-1].isspace() or not before.split()[-1].startswith("-"):
            return None
    if quoted:
        v, start = m.group("qv"), m.start("qv")
    else:
        v, start = _strip_code_tail(m.group("uv")), m.start("uv")
    if not _env_value_ok(kind, name, v, quoted, bool(m.group("q")), _env_line(text, pos, m)):
        return None
    return start, start + len(v)


def _env_line(text: str, pos: int, m: re.Match[str]) -> bool:
    """``DB_PASSWORD=value``: an upper-case name starting a line or a shell word, ``=`` with no spaces around."""
    if m.group("sep") != "=" or m.group("q") or m.end("sep") != m.start("uv"):
        return False
    if not text[pos : m.start("sep")].replace("_", "").replace("-", "").isupper():
        return False
    i = pos
    while i > 0 and (text[i - 1].isupper() or text[i - 1].isdigit() or text[i - 1] == "_"):
        i -= 1
    return i == 0 or text[i - 1] in "\n\t ;+\u2192"  # also an added patch line, a numbered Read line


# The keyword's first letters in lower, upper and capitalised case; camelCase names (``apiKey``, ``authKey``)
# need their own anchors because the anchor crosses the case change.
_ENV_ANCHORS = (
    *(
        v
        for k in ("secre", "passw", "passp", "pwd", "token", "api_k", "apike", "api-k", "acces", "priva", "crede")
        for v in (k, k.upper(), k.capitalize())
    ),
    *("apiKe", "ApiKe", "auth_", "AUTH_", "Auth_", "auth-", "authk", "authK", "AuthK", "AUTHK"),
)  # fmt: skip

# -- AWS secret access keys next to their key id -----------------------------------------------------------

_AWS_ID_RX = re.compile(r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")
_AWS_SECRET_RUN = re.compile(r"[A-Za-z0-9/+]+")
_AWS_NEAR = 400  # characters either side of the key id


def _aws_secret_like(v: str) -> bool:
    """40 base64 characters that look random: both cases, few English words."""
    return any(c.islower() for c in v) and any(c.isupper() for c in v) and wordy(v) < 0.4


def _aws_pair_find(text: str, pos: int) -> tuple[int, int] | None:
    """The secret access key written near an access key id (``AKIA...``), in any layout: the same line, the
    next lines, a JSON object or array, an env block. The nearest 40-character base64 run within
    ``_AWS_NEAR`` characters either side of the id, before or after it."""
    m = _AWS_ID_RX.match(text, pos)
    if m is None or not boundary_ok(text, pos):
        return None
    best: tuple[int, int, int] | None = None
    lo, hi = max(0, pos - _AWS_NEAR), min(len(text), m.end() + _AWS_NEAR)
    for r in _AWS_SECRET_RUN.finditer(text, lo, hi):
        s, e = r.span()
        if e - s == 41 and (
            (s > 0 and text[s - 1] == "\\" and text[s] in "nrt")  # an escaped newline glued to it
            or (text[s] == "+" and (s == 0 or text[s - 1] == "\n"))  # an added patch line
        ):
            s += 1
        if e - s != 40 or (e == hi and e < len(text) and _AWS_SECRET_RUN.match(text, e)):
            continue
        if (s == lo and s > 0 and _AWS_SECRET_RUN.match(text, s - 1)) or not _aws_secret_like(text[s:e]):
            continue
        dist = s - m.end() if s >= m.end() else pos - e
        if best is None or dist < best[0]:
            best = (dist, s, e)
    return None if best is None else (best[1], best[2])


# -- e-mail addresses -------------------------------------------------------------------------------------

# Generic TLDs seen in addresses; any two-letter country code except ones that are common file extensions
# (``x@setup.py`` is not an address). Code such as ``h@self.proj.weight`` fails the TLD test.
_GENERIC_TLDS = frozenset(
    "com net org edu gov mil int info biz name pro mobi aero coop jobs travel asia io ai dev app tech cloud "
    "email online site page blog shop store live life world today news media studio design agency team "
    "tools works zone network digital software science space systems solutions services company group "
    "global academy center consulting engineering finance capital health law legal art club xyz inc llc "
    "ltd family foundation institute university school church land email codes guru ninja rocks".split()
)
_NOT_CC = frozenset("py sh md js ts rb go cs so gz xz bz db hs kt pm rs".split())
_LOCAL_REVERSED_RX = re.compile(r"[A-Za-z0-9._%+\-]{1,64}")
_DOMAIN_RX = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.)+([A-Za-z]{2,24})(?![A-Za-z0-9_\-(\[])"
)
_RESERVED = ("example.com", "example.net", "example.org", "example", "test", "invalid", "localhost", "local")
_LOGIN_CMD_RX = re.compile(r"(?:^|[\s;|&(`'\"])(?:ssh|scp|sftp|rsync|mosh|autossh|ssh-copy-id)(?=\s)")


def _email_find(text: str, pos: int) -> tuple[int, int] | None:
    # The local part, read backwards from the "@" (a backward regex search would retry every start).
    m = _LOCAL_REVERSED_RX.match(text[pos - 1 : pos - 65 if pos >= 65 else None : -1]) if pos else None
    if m is None:
        return None
    start = pos - m.end()
    while True:  # an escape glued to the address is not part of it (``\nuser@``, ``%3Cuser@``)
        if start >= 1 and text[start - 1] == "\\" and text[start] in "nrt":
            start += 1
        elif text[start] == "%" and text[start + 1 : start + 3].isalnum() and start + 3 < pos:
            start += 3
        else:
            break
    local = text[start:pos]
    if not local or local[0] == "." or local[-1] == "." or local.lower() in ("noreply", "no-reply"):
        return None
    d = _DOMAIN_RX.match(text, pos + 1)
    if d is None:
        return None
    tld = d.group(1).lower()
    if not (tld in _GENERIC_TLDS or (len(tld) == 2 and tld not in _NOT_CC)):
        return None
    domain = d.group(0).lower()
    if any(domain == r or domain.endswith("." + r) for r in _RESERVED):
        return None
    if text.startswith(":", d.end()) or text[max(0, start - 3) : start].endswith(("//", ":/")):
        return None  # ``git@github.com:org/repo`` (scp syntax), ``ssh://git@host`` (a login, not an address)
    line_start = text.rfind("\n", 0, start) + 1
    if _LOGIN_CMD_RX.search(text, max(line_start, start - 300), start):
        return None  # ``ssh deploy@host.company.io``
    return start, d.end()


# -- the rule table ---------------------------------------------------------------------------------------

RULES: list[tuple[str, tuple[str, ...], Find]] = [
    (
        "private_key",
        ("-----",),
        _regex(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|[\s\S]*)",
            boundary=False,
        ),
    ),
    ("anthropic_key", ("sk-",), _regex(r"sk-ant-[a-z]{3,6}\d{2}-[A-Za-z0-9_\-]{20,}")),
    ("openrouter_key", ("sk-",), _regex(r"sk-or-(?:v\d-)?[A-Za-z0-9]{32,}")),
    (
        "openai_key",
        ("sk-",),
        _regex(
            r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_\-]{20,}|sk-[A-Za-z0-9]{20,}T3BlbkFJ[A-Za-z0-9]{20,}"
            r"|sk-(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{32,}\b"
        ),
    ),
    ("aws_access_key", ("AKIA", "ASIA", "ABIA", "ACCA"), _regex(r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b")),
    (
        "aws_secret_key",
        ("aws", "AWS", "Aws"),
        _regex(
            r"(?i)aws[A-Za-z0-9_\-. ]{0,20}?secret[A-Za-z0-9_\-. ]{0,20}?\\?[\"']?\s*[:=]\s*\\?[\"']?"
            r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
            group=1,
            boundary=False,
        ),
    ),
    ("aws_secret_key", ("AKIA", "ASIA"), _aws_pair_find),
    (
        "gcp_private_key_id",
        ('"priv',),
        _regex(r"\"private_key_id\"\s*:\s*\"([a-f0-9]{40})\"", group=1, boundary=False),
    ),
    ("gcp_api_key", ("AIza",), _regex(r"AIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])")),
    ("github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), _regex(r"gh[pousr]_[A-Za-z0-9]{36,}")),
    ("github_token", ("_pat_",), _regex(r"github_pat_[A-Za-z0-9_]{22,}", back=6)),
    ("gitlab_token", ("glpat", "gldt-", "glrt-"), _regex(r"(?:glpat|gldt|glrt)-[A-Za-z0-9_\-]{20,}")),
    ("npm_token", ("npm_",), _regex(r"npm_(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{36}(?![A-Za-z0-9_])")),
    (
        "slack_webhook",
        ("hooks",),
        _regex(r"hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/\-]{20,}", boundary=False),
    ),
    ("slack_token", ("xox",), _regex(r"xox[abposre]-[A-Za-z0-9\-]{10,}")),
    ("stripe_key", ("_live", "_test"), _regex(r"(?:sk|rk|pk|whsec)_(?:live|test)_[A-Za-z0-9]{16,}", back=5)),
    ("hf_token", ("hf_",), _regex(r"hf_[A-Za-z0-9]{30,}\b")),
    ("jwt", ("eyJ",), _regex(r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")),
    (
        "bearer_token",
        ("earer", "EARER", "asic ", "ASIC "),
        _regex(r"(?i)(?:bearer|basic)\s+([A-Za-z0-9\-._~+/]{16,}=*)", group=1, back=2),
    ),
    (
        "url_password",
        ("://",),
        _regex(r"://(?!\[REDACTED)[^\s:/@'\"]*:(?!\[REDACTED)([^\s@/'\"]{3,})@", group=1, boundary=False),
    ),
    (
        "sentry_dsn",
        ("://",),
        _regex(r"://([0-9a-f]{32}(?::[0-9a-f]{32})?)@[A-Za-z0-9.\-]+(?::\d+)?/\d+", group=1, boundary=False),
    ),
    ("env_secret", _ENV_ANCHORS, _env_find),
    ("email", ("@",), _email_find),
]

# Prefixes of shaped secrets whose base64 encoding is searched for (redact.py decodes and re-scans). A prefix
# of 3 bytes is only found at the start of a base64 group, so ``hf_`` also comes after ``=``, ``:`` and ``"``.
BASE64_PREFIXES: tuple[bytes, ...] = (
    b"sk-ant-", b"sk-proj-", b"sk-or-v1-", b"sk-svcacct-", b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_",
    b"github_pat_", b"glpat-", b"xoxb-", b"xoxp-", b"xoxa-", b"xoxe-", b"AKIA", b"ASIA", b"AIza", b"npm_",
    b"hf_", b"=hf_", b":hf_", b'"hf_', b"sk_live_", b"rk_live_", b"-----BEGIN",
)  # fmt: skip
