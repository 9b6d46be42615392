"""The redactor's fast paths give exactly what the plain paths give: the ahocorasick-rs scan (bytes DFA) vs
pyahocorasick vs the str.find scan, and ``redact_obj``'s one-scan check of a JSON value vs the walk over
every key and value."""

from __future__ import annotations

import random
import string

import orjson
import pytest

from composer_replication.ingestion import redact as R
from composer_replication.ingestion.redact import Redactor


def _tok(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


def _texts() -> list[str]:
    rng = random.Random(7)
    gh, ant = "ghp_" + _tok(rng, 36), "sk-ant-api03-" + _tok(rng, 40)
    return [
        f"plain ascii, then {gh} and mail bob.smith@acme-corp.io",
        f"naïve café 😀 — {gh} — ünïcödé après {ant} 終わり",
        f"Ω{gh[:6]}\\\n{gh[6:]} continued",  # a line continuation inside the secret
        f'export PASSWORD="hunter2-{_tok(rng, 8)}"\n"private_key_id": "{"a" * 40}"',
        "lone \ud800 surrogate " + gh,  # no UTF-8 form: the rs scanner hands it to its fallback
        "token tokens @ :// ----- hooks nothing secret here",
        "",
    ]


def _hits(scanner, text: str) -> list[tuple[int, str]]:
    return sorted(scanner.iter(text) if scanner is not None else R._find_hits(text))


@pytest.mark.skipif(not isinstance(R._AUTOMATON, R._RustScanner), reason="ahocorasick-rs not installed")
def test_rust_scanner_reports_what_pyahocorasick_and_str_find_report(monkeypatch: pytest.MonkeyPatch) -> None:
    rs = R._AUTOMATON
    engines = [rs, rs._fallback, None]
    for text in _texts():
        found = [_hits(e, text) for e in engines]
        assert found[0] == found[1] == found[2], text
        for end, anchor in found[0]:  # character positions, also after multi-byte characters
            assert text[end - len(anchor) + 1 : end + 1] == anchor
    outs = []
    for e in engines:
        monkeypatch.setattr(R, "_AUTOMATON", e)
        r = Redactor()
        outs.append(([r.redact(t) for t in _texts()], dict(r.counts)))
    assert outs[0] == outs[-1] and outs[0] == outs[1]
    assert sum(outs[0][1].values()) >= 5


def _values() -> list:
    rng = random.Random(3)
    gh = "ghp_" + _tok(rng, 36)
    return [
        {"command": "ls -la", "description": "list files"},
        {"command": f"curl -H 'Authorization: token {gh}' https://api.github.com"},
        {"env": {gh: "1", "ghp_" + _tok(rng, 36): "2"}, "nested": [{gh: {"x": gh}}]},  # secrets as keys
        {"cmd": f"echo {gh[:3]}\\\n{gh[3:]}"},  # an anchor formed only once the continuation is joined
        {"cmd": f"echo {gh[:3]}\\\r\n{gh[3:]}"},
        {"file": "k.json", "content": '{"private_key_id": "' + "b" * 40 + '"}'},  # the anchor with a quote
        {"text": "naïve 😀 " + gh, "n": 3, "ok": True, "none": None, "f": 1.5},
        {"s": "lone \ud800 " + gh},  # orjson cannot encode it: walked
        {"big": 2**70, "s": gh},  # nor this
        ["plain", ["deep", ["er", {"a": "b"}]]],
        [],
        {},
    ]


def test_redact_obj_check_equals_the_walk() -> None:
    for v in _values():
        fast, walk = Redactor(), Redactor()
        assert fast.redact_obj(v) == walk._redact_walk(v), v
        assert fast.counts == walk.counts, v
    total = Redactor()
    for v in _values():
        total.redact_obj(v)
    assert total.counts["github_token"] >= 8 and total.counts["gcp_private_key_id"] == 1


def _encoded(v):
    try:
        return orjson.dumps(v)
    except (TypeError, ValueError):
        return None


def test_redact_json_from_the_callers_encoding_equals_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bytes the parser already encoded (scanned as they are) decide as the walk does, with every scanner."""
    engines = [R._AUTOMATON, getattr(R._AUTOMATON, "_fallback", None), None]
    for e in engines:
        monkeypatch.setattr(R, "_AUTOMATON", e)
        for v in _values():
            if not isinstance(v, (dict, list)):
                continue
            fast, walk = Redactor(), Redactor()
            got = fast.redact_json(v, _encoded(v))
            assert got == walk._redact_walk(v), v
            assert fast.counts == walk.counts, v
            if not walk.counts:
                assert got is v  # clean: the value itself, not a copy
    v = _values()[1]
    assert Redactor(enabled=False).redact_json(v, None) is v


def test_redact_obj_with_redaction_off_returns_the_value() -> None:
    v = _values()[1]
    assert Redactor(enabled=False).redact_obj(v) == v
