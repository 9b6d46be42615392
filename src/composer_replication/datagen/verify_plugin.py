"""The verifier's pytest plugin: copied into each verification sandbox under a random name and loaded
with ``-p`` (``PYTEST_ADDOPTS``); the harness never imports it.

It appends JSON lines to ``$CR_VERIFY_REPORT``: ``start``; ``items`` (the node ids collected, and the
collection errors); one ``test`` line per test with its outcome; ``finish`` with pytest's exit status.
A test counts as ``passed`` only when its setup, call and teardown all returned without an exception,
as seen by the innermost hook wrappers around the phases themselves, so report hooks
(``pytest_runtest_makereport``, ``pytest_report_teststatus``) cannot turn a failure into a pass, and a
skip or an expected failure is not a pass. Lines are written as they happen: a run cut short (``os._exit``,
``pytest.exit``, a kill) leaves no ``finish`` line, and the tests it never reached have no ``test`` line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from typing import Any

import pytest

_PATH = os.environ.get("CR_VERIFY_REPORT", "")  # left in the environment for pytest processes it starts
_phases: dict[str, dict[str, str]] = {}
_errors: list[str] = []


def _write(record: dict[str, Any]) -> None:
    if _PATH:
        with open(_PATH, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _watch(item: pytest.Item, phase: str) -> Generator[None, Any, Any]:
    outcome = "fail"
    try:
        result = yield
        outcome = "ok"
        return result
    except pytest.skip.Exception:
        outcome = "skip"
        raise
    finally:
        _phases.setdefault(item.nodeid, {})[phase] = outcome
        if phase == "teardown":
            seen = _phases.pop(item.nodeid)
            result_of = "skipped" if "skip" in seen.values() else "failed"
            if all(seen.get(p) == "ok" for p in ("setup", "call", "teardown")):
                result_of = "passed"
            _write({"event": "test", "id": item.nodeid, "outcome": result_of})


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _watch(item, "setup"))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _watch(item, "call"))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _watch(item, "teardown"))


def pytest_sessionstart(session: pytest.Session) -> None:
    _write({"event": "start"})


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _errors.append(report.nodeid or "<collection>")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _write({"event": "items", "ids": [i.nodeid for i in session.items], "errors": list(_errors)})


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write({"event": "finish", "exitstatus": int(exitstatus), "errors": list(_errors)})
