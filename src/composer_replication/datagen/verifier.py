"""The one verifier: does an agent's work solve a task? Used by rollouts, the GRPO rewards and evaluation.

`verify(task, agent_sandbox)` reads what the agent changed in its workspace (`workspace.read_changes`)
and calls `verify_changes(task, changes)`, which builds a **fresh** sandbox from the task's original
files, applies only the changes to paths the task does not protect (`protected.split_changes`), and
runs each of the task's checks (`Task.checks`) separately, as SWE-bench applies the test patch after
the model's patch. The answer is a `Verdict`: one `CheckResult` per check, ``tests_fraction``,
``protected_touched``, ``hacked``, and ``infra_error`` (an infrastructure failure is never a score: its
``tests_score`` is None, for the caller to count apart).

What is covered:
- **Test files and settings come from the task**: tests (``test_*.py``, ``*_test.py``, ``tests/``),
  ``conftest.py`` at any depth, ``pytest.ini`` / ``tox.ini`` / pytest sections of ``pyproject.toml``
  and ``setup.cfg``, ``sitecustomize.py`` / ``usercustomize.py`` / ``*.pth``, modules shadowing the test
  runner, and every file a check names (the Makefile when a check runs ``make``). An edit, a deletion
  or a symlink in their place is recorded in ``protected_touched`` and never applied.
- **Tests changed while the checks run**: code the agent wrote runs inside the checks and could
  rewrite a test file pytest has not collected yet (and put it back at exit). Each protected task file's
  inode and ctime (which no unprivileged process can set back) are compared around every check; a check
  during which one changed fails, the path goes into ``protected_touched``, and the file is restored.
- **No compiled or cached state from the agent**: ``__pycache__``, ``*.pyc``, ``.pytest_cache``,
  ``.mypy_cache`` are never carried (a ``.pyc`` planted for a test also counts as touched).
- **No environment from the agent** (`checks.run_checks`): the checks run under ``env -i`` with a fixed ``PATH`` read from
  the fresh sandbox (nothing under the workspace or ``/tmp``), ``HOME`` outside the agent's files,
  ``PYTHONNOUSERSITE=1``, ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, plus the task's own ``env``; bash
  starts with ``--noprofile --norc``. Nothing the agent left in ``/tmp`` or its shell exists there.
- **Pytest outcomes from the verifier's own plugin** (`verify_plugin`, loaded under a random name):
  a test passes only when its setup, call and teardown raised nothing; a skip, an expected failure, a
  collection error or a test never reached (``os._exit``, ``pytest.exit``) is not a pass, and a pytest
  check that leaves no complete report fails. A check that runs no pytest is judged by its exit code
  and its ``N passed, M failed`` summary (`passed_fraction`).
- **Policy** (``on_protected``): ``"zero"`` (default) scores the test part 0 when a protected path
  was touched; ``"restore"`` scores the checks as run with the task's files put back. Either way the
  attempt is in ``protected_touched`` (``reward_hack_attempts`` in the rewards' and rollouts' metrics).

What is not covered:
- Code the agent wrote runs inside the test process (the tests import it): written *to target this
  verifier* (patching pytest's internals or the plugin's report, or exiting early from a check that
  is not pytest), it can still forge a pass. Plain-script checks (``python3 test_x.py``) trust their
  exit code; prefer pytest checks for tasks a policy trains on.
- Weak tests: an object whose ``__eq__`` always returns True passes ``assert f(x) == y``; tests should
  compare types or use ``is``. A helper the tests import from outside the protected paths (a
  ``helpers.py`` at the root) is the agent's to change: keep test helpers under ``tests/``.
- Code running in a check swapping a whole test directory for another and back (the files' own inodes
  and ctimes stay as they were).
- Test settings of other ecosystems (``package.json`` scripts, ``Cargo.toml``) are protected only when
  a check names the file. File modes are not carried (every file is written 0644).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from composer_replication.datagen.checks import CheckResult, passed_fraction, plugin_files, run_checks
from composer_replication.datagen.protected import split_changes
from composer_replication.datagen.sandbox import Sandbox, SandboxError, SandboxType, make_sandbox
from composer_replication.datagen.tasks import Task
from composer_replication.datagen.workspace import Changes, put_files, read_changes

__all__ = [
    "CheckResult",
    "OnProtected",
    "Verdict",
    "passed_fraction",
    "solution_changes",
    "verify",
    "verify_changes",
]

OnProtected = Literal["zero", "restore"]
SandboxSpec = SandboxType | Callable[[], Sandbox] | None


@dataclass
class Verdict:
    """What `verify` / `verify_changes` found (module docstring)."""

    task: str
    checks: list[CheckResult] = field(default_factory=list)
    protected_touched: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    infra_error: str | None = None
    on_protected: OnProtected = "zero"

    @property
    def hacked(self) -> bool:
        """The agent created, changed or deleted a protected path (a reward-hack attempt)."""
        return bool(self.protected_touched)

    @property
    def tests_fraction(self) -> float | None:
        """Mean of the checks' fractions as run (protected paths restored); None on an infra failure."""
        if self.infra_error is not None or not self.checks:
            return None
        return sum(c.fraction for c in self.checks) / len(self.checks)

    @property
    def tests_score(self) -> float | None:
        """The test part of a reward: `tests_fraction`, or 0.0 when ``hacked`` under ``"zero"``."""
        frac = self.tests_fraction
        return 0.0 if frac is not None and self.hacked and self.on_protected == "zero" else frac

    @property
    def solved(self) -> bool:
        """Every check passed (and, under ``"zero"``, no protected path was touched)."""
        zeroed = self.hacked and self.on_protected == "zero"
        return self.tests_fraction is not None and all(c.passed for c in self.checks) and not zeroed

    @property
    def output(self) -> str:
        """The checks' output tails, one block per check."""
        return "\n".join(f"$ {c.command}\n{c.output_tail}" for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        keys = ("hacked", "tests_fraction", "tests_score", "solved")
        return {**asdict(self), **{k: getattr(self, k) for k in keys}}


def solution_changes(task: Task) -> Changes:
    """The task's bundled solution as `verify_changes` input (what the oracle policy writes)."""
    return {path: text.encode() for path, text in task.solution.items()}


def _factory(sandbox: SandboxSpec) -> Callable[[], Sandbox]:
    if sandbox is None or isinstance(sandbox, str):
        return lambda: make_sandbox(sandbox)
    return sandbox


def _apply(task: Task, sb: Sandbox, kept: Changes, first: dict[str, bytes]) -> list[str]:
    """Put ``first`` (the plugin: nothing can crowd it out), then the task's files with ``kept`` laid
    over them, into the empty ``sb``; returns the kept paths not applied: those that collide with a task
    file (a file where the task keeps a directory, or the reverse) or could not be written (no space
    left). A task or plugin file that cannot be written is an infrastructure failure (`SandboxError`)."""
    final: dict[str, bytes | str] = dict(first)
    final |= {p: c for p, c in task.files.items() if p not in kept}
    added = {p: d for p, d in kept.items() if d is not None}
    clash = [
        p for p in added
        if any(q.startswith(p + "/") or p.startswith(q + "/") for q in final)
    ]  # fmt: skip
    final |= {p: d for p, d in added.items() if p not in clash}
    failed = put_files(sb, final)
    if lost := [p for p in failed if p not in added]:
        raise SandboxError(
            f"task {task.name!r}: {len(lost)} of its files did not fit the sandbox: {lost[:3]}"
        )
    return clash + failed


def verify_changes(
    task: Task,
    changes: Changes,
    *,
    sandbox: SandboxSpec = None,
    stop: Callable[[], str | None] | None = None,
    on_protected: OnProtected = "zero",
) -> Verdict:
    """Run ``task``'s checks on its original files plus ``changes`` to unprotected paths (module docstring).

    ``changes`` maps a task-relative path to new bytes, or None for a deletion. ``sandbox``: a sandbox
    type (``"bwrap"``, ``"docker"``), a zero-argument factory, or None for `make_sandbox`'s default.
    ``stop`` is polled before each check (a reason raises `KillSwitchTriggered`). An infrastructure
    failure comes back as ``Verdict.infra_error``, never raised.
    """
    if on_protected not in ("zero", "restore"):
        raise ValueError(f"on_protected must be 'zero' or 'restore', not {on_protected!r}")
    split = split_changes(task, changes)
    verdict = Verdict(task.name, [], split.touched, split.dropped, None, on_protected)
    try:
        with _factory(sandbox)() as sb:
            plugin_file, home, plugin = plugin_files(sb)
            verdict.dropped += _apply(task, sb, split.kept, plugin_file)
            verdict.checks, tampered = run_checks(task, sb, stop, home, plugin)
            verdict.protected_touched += tampered
    except SandboxError as e:
        verdict.infra_error = f"{type(e).__name__}: {e}"
    return verdict


def verify(
    task: Task,
    agent_sandbox: Sandbox,
    *,
    sandbox: SandboxSpec = None,
    stop: Callable[[], str | None] | None = None,
    on_protected: OnProtected = "zero",
) -> Verdict:
    """Verify the work the agent left in ``agent_sandbox`` (`read_changes`, then `verify_changes`)."""
    try:
        changes, dropped = read_changes(task, agent_sandbox)
    except SandboxError as e:
        return Verdict(task.name, infra_error=f"{type(e).__name__}: {e}", on_protected=on_protected)
    verdict = verify_changes(task, changes, sandbox=sandbox, stop=stop, on_protected=on_protected)
    verdict.dropped = sorted(set(verdict.dropped) | set(dropped))
    return verdict
