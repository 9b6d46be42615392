"""Validating a drafted task with the project's one verifier (`datagen.verifier.verify_changes`).

Each check runs twice in a fresh sandbox with no network: on the starting files (no changes) and with
the reference change. A check that fails with the reference is removed from the task (it tests
something the episode did not finish, needs the network, or hangs); of the rest, those that fail at the
start are FAIL_TO_PASS and those that pass at both are PASS_TO_PASS. A task is kept when at least one
FAIL_TO_PASS check remains. Per-test outcomes of pytest checks give the FAIL_TO_PASS / PASS_TO_PASS
test ids as well (recorded in ``task.toml``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from composer_replication.datagen.tasks import Task

_NETWORK = re.compile(
    r"Network is unreachable|Temporary failure in name resolution|Name or service not known|getaddrinfo|"
    r"Could not resolve host|ENOTFOUND|EAI_AGAIN|Failed to establish a new connection|ConnectionRefusedError|"
    r"nodename nor servname"
)


@dataclass
class Validation:
    kept: bool
    reason: str = ""  # the drop reason when not kept
    detail: str = ""
    fail_to_pass: list[str] = field(default_factory=list)  # check commands
    pass_to_pass: list[str] = field(default_factory=list)
    removed: dict[str, str] = field(default_factory=dict)  # check -> why it was taken out
    tests_fail_to_pass: list[str] = field(default_factory=list)  # pytest ids
    tests_pass_to_pass: list[str] = field(default_factory=list)
    infra: bool = False  # the sandbox failed (not the task): try again on the next run


def validate(task: Task, reference: dict[str, bytes | None], *, sandbox: Any = None) -> Validation:
    """Run ``task``'s checks at the start and with ``reference`` (module docstring)."""
    from composer_replication.datagen.verifier import verify_changes

    start = verify_changes(task, {}, sandbox=sandbox)
    if start.infra_error is None:
        ref = verify_changes(task, reference, sandbox=sandbox)
    else:
        ref = start
    if start.infra_error or ref.infra_error:
        return Validation(False, "sandbox failed", str(start.infra_error or ref.infra_error), infra=True)
    if ref.protected_touched:
        return Validation(
            False,
            "reference fails the checks",
            f"the reference changes protected files {ref.protected_touched[:5]}",
        )
    v = Validation(False)
    for s, r in zip(start.checks, ref.checks, strict=True):
        if not r.passed:
            v.removed[r.command] = _why(r)
        elif s.passed:
            v.pass_to_pass.append(r.command)
        else:
            v.fail_to_pass.append(r.command)
            v.tests_fail_to_pass += [
                t for t, o in r.tests.items() if o == "passed" and s.tests.get(t) != "passed"
            ]
        v.tests_pass_to_pass += [
            t for t, o in r.tests.items() if o == "passed" and s.tests.get(t) == "passed"
        ]
    if v.fail_to_pass:
        v.kept = True
    elif v.pass_to_pass:
        v.reason, v.detail = "checks already pass at the start", "; ".join(v.pass_to_pass)[:300]
    else:
        whys = list(v.removed.values())
        v.reason = (
            "timeout" if all(w.startswith("timed out") for w in whys)
            else "needs the network" if any(w.startswith("needs the network") for w in whys)
            else "reference fails the checks"
        )  # fmt: skip
        v.detail = "; ".join(f"{c}: {w}" for c, w in v.removed.items())[:400]
    return v


def _why(r: Any) -> str:
    if r.timed_out:
        return "timed out"
    if _NETWORK.search(r.output_tail or ""):
        return "needs the network (the sandbox has none)"
    tail = [ln for ln in (r.output_tail or "").strip().splitlines() if ln.strip()]
    return f"fails with the reference (exit {r.returncode}: {tail[-1][:120] if tail else 'no output'})"
