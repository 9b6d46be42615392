"""Hostile corpus: every covered secret shape, in all five places, through the real `ingest` CLI.

The places: user text, a shell command, a command's output, the content of a written file, the content of
a read file; each in a Claude Code session and in a Codex rollout built in the shapes those CLIs write.
Every secret is generated here (never committed) and distinct per (shape, place, format), so a leak names
where it happened. A shape passes when every piece of its secret (both halves of a split one, every line of
a wrapped base64 one) is absent from states.jsonl and traces.jsonl, raw and JSON-decoded.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
import string
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from composer_replication.ingestion.redact import Redactor

ALNUM = string.ascii_letters + string.digits
DJANGO = string.ascii_lowercase + string.digits + "!@$%^&*-_=+"  # Django's alphabet minus ( ) #


class Gen:
    """Random secret material; every value starts with a digit and a letter (shape rules need both)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def r(self, n: int, alphabet: str = ALNUM) -> str:
        c = self.rng.choice
        return c(string.digits) + c(string.ascii_letters) + "".join(c(alphabet) for _ in range(n - 2))

    def hex(self, n: int) -> str:
        return "".join(self.rng.choice("0123456789abcdef") for _ in range(n))


# A shape: (id, the types it may be counted under, build(gen) -> (text, pieces that must vanish)).
Shape = tuple[str, tuple[str, ...], Callable[[Gen], tuple[str, list[str]]]]


def _wrap(b64: str, width: int = 76) -> str:
    return "\n".join(b64[i : i + width] for i in range(0, len(b64), width))


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _ant(g: Gen) -> str:
    return "sk-ant-api03-" + g.r(93, ALNUM + "-_") + "AA"


def _split(g: Gen, prefix: str, n1: int, n2: int) -> tuple[str, str, str]:
    a, b = g.r(n1), g.r(n2)
    return prefix + a + b, a, b


def _django(g: Gen) -> tuple[str, list[str]]:
    parts = [g.r(10, DJANGO) for _ in range(4)]
    return "django-insecure-" + parts[0] + ")" + parts[1] + "#" + parts[2] + "(" + parts[3], parts


def _pem(g: Gen) -> tuple[str, list[str]]:
    lines = [g.r(64, ALNUM + "+/") for _ in range(4)]
    return "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(lines) + "\n-----END RSA PRIVATE KEY-----", lines


def _shapes() -> list[Shape]:
    def one(tmpl: str, make: Callable[[Gen], str]) -> Callable[[Gen], tuple[str, list[str]]]:
        def build(g: Gen) -> tuple[str, list[str]]:
            v = make(g)
            return tmpl.format(v=v), [v]

        return build

    def django(tmpl: str) -> Callable[[Gen], tuple[str, list[str]]]:
        def build(g: Gen) -> tuple[str, list[str]]:
            key, parts = _django(g)
            return tmpl.format(v=key), parts

        return build

    def b64_of(tmpl: str, inner: Callable[[Gen], str], *, wrap: bool = False) -> Callable[..., Any]:
        def build(g: Gen) -> tuple[str, list[str]]:
            secret = inner(g)
            enc = _b64(secret)
            text = _wrap(enc) if wrap else enc
            return tmpl.format(v=text), [*text.split("\n"), secret]

        return build

    def continued(tmpl: str, prefix: str, n1: int, n2: int, cut_in_prefix: int | None = None) -> Any:
        def build(g: Gen) -> tuple[str, list[str]]:
            whole, a, b = _split(g, prefix, n1, n2)
            if cut_in_prefix is None:
                cut = len(prefix) + n1
                pieces = [a, b]
            else:
                cut = cut_in_prefix
                pieces = [a + b]
            return tmpl.format(v=whole[:cut] + "\\\n" + whole[cut:]), pieces

        return build

    def pem(g: Gen) -> tuple[str, list[str]]:
        return _pem(g)

    def pem_b64(g: Gen) -> tuple[str, list[str]]:
        block, lines = _pem(g)
        enc = _wrap(_b64(block))
        return f"tls.key: |\n{enc}", [ln for ln in enc.split("\n") if len(ln) >= 40]

    def email(g: Gen) -> tuple[str, list[str]]:
        addr = f"{g.r(7).lower()}.{g.r(6).lower()}@{g.r(8).lower()}.com"
        return f"Author: Jane Roe <{addr}>", [addr]

    def json_key(g: Gen) -> tuple[str, list[str]]:
        tok = "ghp_" + g.r(36)
        return json.dumps({tok: {"scopes": ["repo"]}}), [tok]

    upper = string.ascii_uppercase + string.digits

    def aws_pair(tmpl: str) -> Callable[[Gen], tuple[str, list[str]]]:
        def build(g: Gen) -> tuple[str, list[str]]:
            key_id = "AKIA" + g.r(16, upper).upper()
            secret = base64.b64encode(g.rng.randbytes(30)).decode()
            return tmpl.format(id=key_id, secret=secret), [key_id, secret]

        return build

    def letters(g: Gen) -> str:
        return "".join(g.rng.choice(string.ascii_letters) for _ in range(14))

    def b64_slash(g: Gen) -> str:
        while not (v := base64.b64encode(g.rng.randbytes(32)).decode()).startswith("/"):
            pass
        return v

    def sentry(g: Gen) -> tuple[str, list[str]]:
        key = g.hex(32)
        dsn = f"https://{key}@o{g.r(7, string.digits)}.ingest.us.sentry.io/{g.r(16, string.digits)}"
        return f"SENTRY_DSN={dsn}", [key]

    return [
        # The shapes that still passed (issue 33).
        ("aws_pair_one_line", ("aws_secret_key",), aws_pair("aws configure: {id} {secret}")),
        ("aws_pair_lines", ("aws_secret_key",), aws_pair("Your new key:\n{id}\n{secret}\nKeep it safe.")),
        ("aws_pair_json", ("aws_secret_key",), aws_pair('{{"user": "ci", "keys": {{"id": "{id}", "value": "{secret}"}}}}')),
        ("aws_pair_env_block", ("aws_secret_key",), aws_pair("env:\n  - name: ACCESS_KEY\n    value: {id}\n"
                                                             "  - name: SECRET_KEY\n    value: {secret}")),  # fmt: skip
        ("env_password_letters", ("env_secret",), one("DB_PASSWORD={v}", letters)),
        ("unnamed_own_line", ("high_entropy",), one("{v}\n", lambda g: g.r(40))),
        ("unnamed_assigned", ("high_entropy",), one("APP_SETTING_7={v}", lambda g: g.r(32))),
        ("sentry_dsn", ("sentry_dsn",), sentry),
        ("base64_starting_with_slash", ("env_secret",), one("SECRET_KEY={v}", b64_slash)),
        # The shapes that leaked (issue 14 item 10).
        ("anthropic_after_%3D", ("anthropic_key",), one("GET /v1/x?cfg=a%26key%3D{v}%26y=1", _ant)),
        ("anthropic_after_\\n", ("anthropic_key",), one('{{\\"note\\": \\"key:\\n{v}\\"}}', _ant)),
        ("github_after_\\u0022", ("github_token",), one("tok\\u0022ghp_{v}\\u0022", lambda g: g.r(36))),
        ("django_env_)#(", ("env_secret",), django("SECRET_KEY={v}")),
        ("django_settings_)#(", ("env_secret",), django("SECRET_KEY = '{v}'")),
        ("django_getenv_)#(", ("env_secret",), django('SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "{v}")')),
        ("npm_bare", ("npm_token",), one("publish with {v} please", lambda g: "npm_" + g.r(36))),
        ("npmrc", ("npm_token",), one("//registry.npmjs.org/:_authToken={v}", lambda g: "npm_" + g.r(36))),
        ("secret_as_json_key", ("github_token",), json_key),
        ("base64_k8s_secret", ("base64_secret", "env_secret"), b64_of("data:\n  token: {v}", lambda g: "ghp_" + g.r(36))),
        ("base64_k8s_unnamed", ("base64_secret",), b64_of("data:\n  gh: {v}", lambda g: "ghp_" + g.r(36))),
        ("base64_docker_auth_off1", ("base64_secret",), b64_of('{{"auths": {{"ghcr.io": {{"auth": "{v}"}}}}}}',
                                                               lambda g: "ci-bot:ghp_" + g.r(36))),  # fmt: skip
        ("base64_docker_auth_off2", ("base64_secret",), b64_of('{{"auth": "{v}"}}', lambda g: "deploy1:ghp_" + g.r(36))),
        ("base64_env_hf_token", ("base64_secret",), b64_of("env: {v}", lambda g: "A=1\nHF_TOKEN=hf_" + g.r(34) + "\n")),
        ("base64_basic_user_hf", ("base64_secret",), b64_of("creds {v}", lambda g: "me:hf_" + g.r(34))),
        ("base64_env_wrapped", ("base64_secret",), b64_of("{v}", lambda g: "ANTHROPIC_API_KEY=" + _ant(g) + "\n", wrap=True)),
        ("base64_aws_key", ("base64_secret",), b64_of("AWS_ACCESS_KEY_ID: {v}",
                                                      lambda g: "AKIA" + g.r(16, upper).upper())),  # fmt: skip
        ("base64_pem_wrapped", ("base64_secret",), pem_b64),
        ("continuation_shell", ("anthropic_key",), continued("export ANTHROPIC_API_KEY={v}", "sk-ant-api03-", 24, 70)),
        ("continuation_in_prefix", ("anthropic_key",), continued("curl -H 'x-api-key: {v}'", "sk-ant-api03-", 40, 50, 5)),
        ("continuation_python", ("hf_token",), continued('HF_TOKEN = "{v}"', "hf_", 16, 18)),
        ("email_author", ("email",), email),
        # Every other covered type, one plain shape each.
        ("openai_proj", ("openai_key",), one("OPENAI_API_KEY={v}", lambda g: "sk-proj-" + g.r(60))),
        ("openai_legacy", ("openai_key",), one("key {v} here", lambda g: "sk-" + g.r(20) + "T3BlbkFJ" + g.r(20))),
        ("openrouter", ("openrouter_key",), one("Authorization {v}", lambda g: "sk-or-v1-" + g.hex(64))),
        ("aws_access_key", ("aws_access_key",), one("aws_access_key_id = {v}", lambda g: "AKIA" + g.r(16, upper).upper())),
        ("aws_secret_key", ("aws_secret_key",), one("aws_secret_access_key = {v}", lambda g: g.r(40, ALNUM + "/+"))),
        ("gcp_api_key", ("gcp_api_key",), one("?key={v}&q=1", lambda g: "AIza" + g.r(35, ALNUM + "_-"))),
        ("gcp_private_key_id", ("gcp_private_key_id",), one('{{"private_key_id": "{v}"}}', lambda g: g.hex(40))),
        ("pem_block", ("private_key",), pem),
        ("github_pat", ("github_token",), one("GH={v}", lambda g: "github_pat_" + g.r(22) + "_" + g.r(59))),
        ("gitlab", ("gitlab_token",), one("PRIVATE-TOKEN: {v}", lambda g: "glpat-" + g.r(20))),
        ("slack_token", ("slack_token",), one("token {v}", lambda g: "xoxb-" + g.r(12, string.digits) + "-" + g.r(24))),
        ("slack_webhook", ("slack_webhook",), one("curl -X POST https://hooks.slack.com/services/{v}",
                                                  lambda g: "T" + g.r(8, upper) + "/B" + g.r(8, upper) + "/" + g.r(24))),  # fmt: skip
        ("stripe", ("stripe_key",), one("stripe.api_key = '{v}'", lambda g: "sk_live_" + g.r(24))),
        ("hf_token", ("hf_token",), one("login {v}", lambda g: "hf_" + g.r(34))),
        ("jwt", ("jwt",), one("session={v}", lambda g: "eyJ" + g.r(20) + ".eyJ" + g.r(30) + "." + g.r(43))),
        ("bearer", ("bearer_token",), one("curl -H 'Authorization: Bearer {v}'", lambda g: g.r(40))),
        ("url_password", ("url_password",), one("DATABASE_URL=postgres://app:{v}@db.internal:5432/prod", lambda g: g.r(16))),
        ("env_password", ("env_secret",), one("DB_PASSWORD={v}", lambda g: g.r(14))),
        ("yaml_api_key", ("env_secret",), one("api_key: {v}", lambda g: g.r(24))),
        ("json_client_secret", ("env_secret",), one('{{"client_secret": "{v}"}}', lambda g: g.r(28))),
        ("cli_password_flag", ("env_secret",), one("mysql --password {v} -u root", lambda g: g.r(14))),
        ("ini_password", ("env_secret",), one("[client]\npassword = {v}\nuser = root", lambda g: g.r(12))),
        ("php_array", ("env_secret",), one("'db_password' => '{v}',", lambda g: g.r(12))),
        ("go_assign", ("env_secret",), one('apiKey := "{v}"', lambda g: g.r(32))),
    ]  # fmt: skip


SHAPES = _shapes()
PLACES = ("user", "command", "output", "write", "read")
_ids = itertools.count()


# -- session writers (the record shapes of tests/data/sessions and interfaces.md §1-2) ----------------------


def _numbered(text: str, sep: str) -> str:
    return "\n".join(f"{i:>6}{sep}{line}" for i, line in enumerate(text.split("\n"), 1))


def _patch(text: str) -> str:
    added = "\n".join("+" + line for line in text.split("\n"))
    return f"*** Begin Patch\n*** Add File: .env\n{added}\n*** End Patch"


def _claude_session(path: Path, texts: dict[str, str], key_secret: str | None) -> None:
    recs: list[dict[str, Any]] = []
    last: list[str | None] = [None]

    def add(type_: str, message: dict[str, Any], **kw: Any) -> None:
        uid = f"u-{next(_ids):08d}-0000-4000-8000-000000000000"
        recs.append({"parentUuid": last[0], "isSidechain": False, "type": type_, "uuid": uid,
                     "sessionId": path.stem, "version": "2.1.38", "cwd": "/w",
                     "timestamp": f"2026-01-01T00:{len(recs) // 60:02d}:{len(recs) % 60:02d}.000Z",
                     "message": message, **kw})  # fmt: skip
        last[0] = uid

    def assistant(block: dict[str, Any]) -> None:
        mid = f"msg_{next(_ids):08d}"
        add("assistant", {"id": mid, "type": "message", "role": "assistant", "model": "claude-x",
                          "content": [block]}, requestId="req_" + mid)  # fmt: skip

    def call(name: str, inp: dict[str, Any], result: str) -> None:
        tid = f"toolu_{next(_ids):08d}"
        assistant({"type": "tool_use", "id": tid, "name": name, "input": inp})
        add(
            "user",
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": result}]},
        )
        assistant({"type": "text", "text": "Done."})

    add("user", {"role": "user", "content": f"Please set up the project.\n{texts['user']}"})
    assistant({"type": "text", "text": "Looking."})
    cmd: dict[str, Any] = {
        "command": f"cat >> .env <<'EOF'\n{texts['command']}\nEOF",
        "description": "append",
    }
    if key_secret:
        cmd["env"] = {key_secret: "1"}
    call("Bash", cmd, "")
    call("Bash", {"command": "cat .env.example", "description": "show"}, texts["output"] + "\n")
    call("Write", {"file_path": "/w/.env", "content": f"# local settings\n{texts['write']}\n"},
         "File created successfully at: /w/.env")  # fmt: skip
    call("Read", {"file_path": "/w/config.env"}, _numbered(f"# settings\n{texts['read']}\nDEBUG=1", "\u2192"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _codex_rollout(path: Path, texts: dict[str, str], key_secret: str | None) -> None:
    lines: list[dict[str, Any]] = [
        {"timestamp": "2026-01-01T00:00:00.000Z", "type": "session_meta",
         "payload": {"id": path.stem, "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/w",
                     "originator": "codex_cli_rs", "cli_version": "0.77.0", "source": "cli"}},
    ]  # fmt: skip

    def item(payload: dict[str, Any]) -> None:
        lines.append({"timestamp": "2026-01-01T00:00:01.000Z", "type": "response_item", "payload": payload})

    def call(name: str, args: dict[str, Any], output: str) -> None:
        cid = f"call_{next(_ids):08d}"
        item({"type": "function_call", "name": name, "arguments": json.dumps(args), "call_id": cid})
        item({"type": "function_call_output", "call_id": cid,
              "output": json.dumps({"output": output, "metadata": {"exit_code": 0, "duration_seconds": 0.1}})})  # fmt: skip
        item({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]})

    item({"type": "message", "role": "user",
          "content": [{"type": "input_text", "text": f"Please set up the project.\n{texts['user']}"}]})  # fmt: skip
    cmd: dict[str, Any] = {
        "command": ["bash", "-lc", f"cat >> .env <<'EOF'\n{texts['command']}\nEOF"],
        "workdir": "/w",
    }
    if key_secret:
        cmd["env"] = {key_secret: "1"}
    call("shell", cmd, "")
    call("exec_command", {"cmd": "cat .env.example"}, texts["output"] + "\n")
    cid = f"call_{next(_ids):08d}"
    item({"type": "custom_tool_call", "status": "completed", "call_id": cid, "name": "apply_patch",
          "input": _patch(f"# local settings\n{texts['write']}")})  # fmt: skip
    item(
        {
            "type": "custom_tool_call_output",
            "call_id": cid,
            "output": "Success. Updated the following files:\nA .env",
        }
    )
    call(
        "shell",
        {"command": ["bash", "-lc", "cat -n config.env"]},
        _numbered(f"# settings\n{texts['read']}", "\t"),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def _decoded_strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in (k, *_decoded_strings(v))]
    if isinstance(obj, list):
        return [s for v in obj for s in _decoded_strings(v)]
    return []


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Write the corpus, run ``composer-replication ingest`` on it once, return what came out."""
    root = tmp_path_factory.mktemp("hostile")
    g = Gen(20261201)
    planted: dict[str, list[tuple[str, str, str]]] = {}  # shape -> [(format, place, piece)]
    for n, (sid, _, build) in enumerate(SHAPES):
        for fmt in ("claude_code", "codex"):
            texts, pieces = {}, []
            for place in PLACES:
                text, vanish = build(g)
                texts[place] = text
                pieces += [(fmt, place, v) for v in vanish]
            key_secret = None
            if sid == "secret_as_json_key":  # also a key of the tool-call input itself
                key_secret = "ghp_" + g.r(36)
                pieces.append((fmt, "command input key", key_secret))
            if fmt == "claude_code":
                _claude_session(
                    root / "in" / "claude" / f"-w-p{n:02d}" / f"s{n:02d}.jsonl", texts, key_secret
                )
            else:
                _codex_rollout(
                    root / "in" / "codex" / f"rollout-2026-01-01T00-00-{n:02d}-x{n:02d}.jsonl",
                    texts,
                    key_secret,
                )
            planted.setdefault(sid, []).extend(pieces)
    out = root / "out"
    cmd = [
        sys.executable,
        "-m",
        "composer_replication.cli.main",
        "ingest",
        str(root / "in"),
        "--out",
        str(out),
        "--no-progress",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Every byte the ingest wrote (the stored sessions in parts/, the references, sessions.jsonl, the stats),
    # and every string of the states and examples as the reader materialises them.
    from composer_replication.ingestion import read_examples, read_states

    files = sorted(f for f in out.rglob("*") if f.is_file() and f.suffix != ".uuids")
    raw = "".join(f.read_text() for f in files)
    rows = [json.loads(line) for f in files if f.suffix == ".jsonl" for line in f.read_text().splitlines()]
    rows += list(read_states(out / "states.jsonl")) + list(read_examples(out / "traces.jsonl"))
    decoded = "\0".join(s for row in rows for s in _decoded_strings(row))
    stats = json.loads((out / "ingest_stats.json").read_text())["totals"]
    return {"raw": raw, "decoded": decoded, "stats": stats, "planted": planted}  # fmt: skip


def test_corpus_was_ingested(ingested: dict[str, Any]) -> None:
    st = ingested["stats"]
    assert st["n_files"] == 2 * len(SHAPES)
    # Every (format, place) produced output: 5 assistant tool turns + text turns per file.
    assert st["n_states_emitted"] >= 2 * len(SHAPES) * 4  # at least one per tool call
    assert st["n_tool_results"] == 2 * len(SHAPES) * 4
    assert "[REDACTED:" in ingested["raw"]


@pytest.mark.parametrize("shape", [s[0] for s in SHAPES])
def test_shape_absent_everywhere(ingested: dict[str, Any], shape: str) -> None:
    leaks = [
        f"{fmt}/{place}: {piece[:24]}..."
        for fmt, place, piece in ingested["planted"][shape]
        if piece in ingested["raw"] or piece in ingested["decoded"]
    ]
    assert not leaks, f"{shape} leaked in {len(leaks)} places: {leaks}"


@pytest.mark.parametrize(("shape", "types", "build"), SHAPES, ids=[s[0] for s in SHAPES])
def test_shape_is_counted_under_its_type(
    shape: str, types: tuple[str, ...], build: Any, ingested: dict
) -> None:
    text, _ = build(Gen(7))
    r = Redactor()
    r.redact(text)
    assert set(types) & set(r.counts), (shape, dict(r.counts))
    assert set(types) & set(ingested["stats"]["redactions"])


def test_redaction_is_idempotent_on_the_corpus() -> None:
    g = Gen(3)
    blob = "\n\n".join(build(g)[0] for _, _, build in SHAPES)
    r = Redactor()
    once = r.redact(blob)
    n = sum(r.counts.values())
    assert r.redact(once) == once and sum(r.counts.values()) == n


def test_find_fallback_gives_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without pyahocorasick the str.find scan redacts the corpus identically."""
    from composer_replication.ingestion import redact as R

    g = Gen(5)
    blob = "\n\n".join(build(g)[0] for _, _, build in SHAPES) + "\nmask_token='<mask>' git@github.com:o/r.git"
    with_automaton = Redactor().redact(blob)
    monkeypatch.setattr(R, "_AUTOMATON", None)
    assert Redactor().redact(blob) == with_automaton
    assert with_automaton.count("[REDACTED:") >= len(SHAPES)


def test_secret_as_key_of_a_tool_input_keeps_both_keys() -> None:
    g = Gen(11)
    a, b = "ghp_" + g.r(36), "ghp_" + g.r(36)
    r = Redactor()
    out = r.redact_obj({"command": "ls", "env": {a: "1", b: "2"}, "nested": [{a: {"x": b}}]})
    assert out == {
        "command": "ls",
        "env": {"[REDACTED:github_token]": "1", "[REDACTED:github_token]#2": "2"},
        "nested": [{"[REDACTED:github_token]": {"x": "[REDACTED:github_token]"}}],
    }
    assert r.counts == {"github_token": 4}
