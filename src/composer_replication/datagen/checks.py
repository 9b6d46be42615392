"""Running a task's checks in the verifier's fresh sandbox and judging them (`datagen.verifier` uses it).

`run_checks(task, sb, stop)` runs each of ``task.checks`` under ``env -i`` (a ``PATH`` read from the
fresh sandbox itself, nothing under the workspace or ``/tmp``; ``HOME`` outside the agent's files; no
user site; no pytest plugin autoload; the task's ``env``; ``bash --noprofile --norc``) with the
verifier's pytest plugin (`verify_plugin`) loaded under a random name, and judges each one (`judge`):
from the plugin's report when pytest ran, else by exit code and ``N passed, M failed`` summary. Around
every check the inode, ctime, size and mode of each protected task file are compared (no unprivileged
process can set a ctime back): a check during which one changed fails, and the file is put back. One
command before the checks and one after each (`_PROBE`) do the bookkeeping, so a check costs two.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_replication.datagen.protected import is_protected
from composer_replication.datagen.sandbox_base import ExecResult, Sandbox, SandboxError
from composer_replication.datagen.tasks import Task
from composer_replication.datagen.workspace import output_cap, put_files
from composer_replication.safety.kill_switch import KillSwitchTriggered

__all__ = ["CheckResult", "judge", "passed_fraction", "run_checks"]

_TAIL = 4000
_PLUGIN = Path(__file__).with_name("verify_plugin.py")
# argv: the protected paths (JSON, or "@file" holding it), the report to return ("-": none). Prints the
# sandbox's own PATH, a short digest of each path's (inode, ctime, size, mode), and the report.
_PROBE = r"""
import base64, hashlib, json, os, sys, zlib
spec, report = sys.argv[1], sys.argv[2]
digests = []
for rel in json.load(open(spec[1:])) if spec.startswith("@") else json.loads(spec):
    try:
        st = os.lstat(rel)
        digests.append(hashlib.sha256(repr((st.st_ino, st.st_ctime_ns, st.st_size, st.st_mode)).encode()).hexdigest()[:8])
    except OSError:
        digests.append("gone")
print("CR-PATH " + os.environ.get("PATH", ""))
print("CR-STAT " + json.dumps(digests))
if report != "-":
    try:
        with open(report, "rb") as f:
            print("CR-REPORT " + base64.b64encode(zlib.compress(f.read(16 << 20))).decode())
    except OSError:
        print("CR-REPORT -")
"""


@dataclass
class CheckResult:
    """One check command: ``passed`` (every test it ran passed, exit 0), ``fraction`` of its tests
    passing, the last 4000 characters of its output, and per-test outcomes for pytest checks."""

    command: str
    passed: bool
    fraction: float
    output_tail: str
    timed_out: bool = False
    returncode: int = 0
    tests: dict[str, str] = field(default_factory=dict)


def passed_fraction(output: str, ok: bool) -> float:
    """Passed / (passed + failed + errors) from the last pytest-style summary line; else 1.0 / 0.0 by
    the exit status. ``N passed, M failed`` from another test script is read the same way."""
    for line in reversed(output.strip().splitlines()):
        counts = {k.rstrip("s"): int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?)\b", line)}
        if counts:
            passed = counts.get("passed", 0)
            total = passed + counts.get("failed", 0) + counts.get("error", 0)
            return passed / total if total else float(ok)
    return 1.0 if ok else 0.0


def _runs_pytest(command: str) -> bool:
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    return any(Path(w).name in ("pytest", "py.test") for w in words)


def judge(command: str, r: Any, report: bytes | None) -> CheckResult:
    """A check's result from its exit (an `ExecResult`) and, when pytest ran, the plugin's report."""
    base = {"command": command, "output_tail": r.output[-_TAIL:], "timed_out": r.timed_out}
    base["returncode"] = r.returncode
    records = []
    for line in (report or b"").decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    starts = [x for x in records if x.get("event") == "start"]
    if not starts:  # no pytest session reported: a pytest check failed to run (or was cut short)
        if _runs_pytest(command):
            return CheckResult(passed=False, fraction=0.0, **base)
        return CheckResult(passed=r.ok, fraction=passed_fraction(r.output, r.ok), **base)
    ids: list[str] = []
    errors: set[str] = set()
    tests: dict[str, str] = {}
    for rec in records:
        if rec.get("event") in ("items", "finish"):
            ids += [i for i in rec.get("ids", []) if isinstance(i, str)]
            errors.update(e for e in rec.get("errors", []) if isinstance(e, str))
        elif rec.get("event") == "test" and isinstance(rec.get("id"), str):
            if tests.get(rec["id"], "passed") == "passed":  # a test run twice keeps its worst outcome
                tests[rec["id"]] = str(rec.get("outcome"))
    for i in ids:
        tests.setdefault(i, "not run")
    tests.update({f"<collection error: {e}>": "error" for e in errors})
    finished = sum(x.get("event") == "finish" for x in records) == len(starts)
    n_passed = sum(o == "passed" for o in tests.values())
    passed = r.ok and finished and bool(tests) and n_passed == len(tests)
    return CheckResult(passed=passed, fraction=n_passed / len(tests) if tests else 0.0, tests=tests, **base)


def _probe(sb: Sandbox, spec: str, report: str = "-") -> tuple[str, list[str], bytes | None]:
    """``(PATH, digests, report bytes or None)`` from one `_PROBE` command."""
    with output_cap(sb):
        r = sb.exec(f"python3 -I -S -c {shlex.quote(_PROBE)} {shlex.quote(spec)} {shlex.quote(report)}", 120)
    lines = {x.split(" ", 1)[0]: x.partition(" ")[2] for x in r.output.splitlines() if x.startswith("CR-")}
    if not r.ok or "CR-STAT" not in lines:
        raise SandboxError(f"the verifier's probe failed in the sandbox: {r.output.strip()[-300:]}")
    data = None
    if lines.get("CR-REPORT", "-") != "-":
        try:
            data = zlib.decompress(base64.b64decode(lines["CR-REPORT"]))
        except (ValueError, zlib.error):
            data = None  # a report the check mangled: as if there were none
    return lines.get("CR-PATH", ""), json.loads(lines["CR-STAT"]), data


def _clean_path(sb: Sandbox, path: str) -> str:
    """The fresh sandbox's own PATH, without anything the agent could write or a relative entry."""
    keep = []
    for d in path.strip().split(":"):
        p = Path(d)
        writable = any(p == Path(w) or Path(w) in p.parents for w in (sb.workdir, "/tmp", "/var/tmp"))
        if p.is_absolute() and ".." not in p.parts and not writable and d not in keep:
            keep.append(d)
    return ":".join(keep) or "/usr/local/bin:/usr/bin:/bin"


def _env(task: Task, sb: Sandbox, path: str, home: str, plugin: str) -> dict[str, str]:
    env = {"PATH": _clean_path(sb, path), "HOME": home, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    env |= {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env |= task.env
    env["PYTHONPATH"] = ":".join(filter(None, [home, task.env.get("PYTHONPATH")]))
    env["PYTEST_ADDOPTS"] = " ".join(filter(None, [f"-p {plugin}", task.env.get("PYTEST_ADDOPTS")]))
    return env


def plugin_files(sb: Sandbox) -> tuple[dict[str, bytes], str, str]:
    """``(files, home, plugin)``: the plugin under a random name, to put in ``sb`` before anything else."""
    nonce = uuid.uuid4().hex[:16]
    home, plugin = f".cr-verify-{nonce}", f"cr_verify_{nonce}"
    return {f"{home}/{plugin}.py": _PLUGIN.read_bytes()}, home, plugin


def run_checks(
    task: Task, sb: Sandbox, stop: Callable[[], str | None] | None, home: str, plugin: str
) -> tuple[list[CheckResult], list[str]]:
    """Each check's result, and ``"<path> (changed during a check)"`` for each protected file a check
    changed while it ran (module docstring). ``home``/``plugin``: from `plugin_files`, already put."""
    wd = sb.workdir.rstrip("/")
    guarded = [p for p in task.files if is_protected(task, p)]
    spec = json.dumps(guarded)
    if len(spec) > 3000:  # a long command is slow for the tripwire to parse: the list goes in a file
        sb.put(f"{home}/protected.json", spec)
        spec = f"@{home}/protected.json"
    path, before, _ = _probe(sb, spec)
    env = _env(task, sb, path, f"{wd}/{home}", plugin)
    results, tampered = [], []
    for i, check in enumerate(task.checks):
        if stop is not None and (reason := stop()) is not None:
            raise KillSwitchTriggered(reason)
        report = f"{wd}/{home}/report-{i}.jsonl"
        assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in (env | {"CR_VERIFY_REPORT": report}).items())
        r: ExecResult = sb.exec(
            f"exec env -i {assigns} bash --noprofile --norc -c {shlex.quote(check)}", task.timeout_s
        )
        if spec.startswith("@"):  # the check could have changed the list
            sb.put(spec[1:], json.dumps(guarded))
        _, after, data = _probe(sb, spec, report)
        result = judge(check, r, data)
        changed = [p for p, a, b in zip(guarded, before, after, strict=True) if a != b]
        if changed:
            result.passed, result.fraction = False, 0.0
            result.output_tail += f"\n[protected files changed while this check ran: {changed[:5]}]"
            tampered += [n for n in (f"{p} (changed during a check)" for p in changed) if n not in tampered]
            sb.exec("rm -rf -- " + " ".join(shlex.quote(p) for p in changed), timeout=60)
            put_files(sb, {p: task.files[p] for p in changed})
            _, before, _ = _probe(sb, spec)
        results.append(result)
    return results, tampered
