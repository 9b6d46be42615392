"""Before replay pays for anything: check that every later stage of the run can run.

The replay stage is the only one that spends money; a stage after it that cannot run (a missing
extra, a module that extra forgot, no sandbox, a bad training section) would otherwise fail after the
teacher calls were paid. So before its first call the replay stage runs :func:`check_later_stages`
over the enabled stages after it that this invocation will run (up to ``run --until``, so replay and
pairs can run on a machine without the training extras):

- ``normalize`` (unless ``normalize.skip_dj``): data-juicer imports with its install guard, the
  recipe loads, and a dry run over two tiny pairs (this imports ``data_juicer.core``, which needs
  ``ray``);
- ``train_offline``: torch and transformers import, the offline phase's trainer config builds and
  the student model resolves offline;
- ``train_grpo`` (``grpo.enabled``): trl and datasets import, the GRPO phase's trainer config builds,
  and a sandbox starts and runs ``true``;
- ``evaluate`` with ``evaluate.sandbox_tasks``: a sandbox starts and runs ``true``;
- ``report``: matplotlib imports.

Every failure is collected and raised as one :class:`PreflightError` that names the stage, the
problem and the command or setting that fixes it. Not covered: failures that depend on the data the
later stages will see (e.g. no pair survives normalisation), or on resources at that time (memory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

EXTRA_INSTALL = "pip install torch==2.13.0 'composer-replication[{extra}]'"


def _tiny_pairs() -> list[dict[str, Any]]:
    from composer_replication.wire import format_tool_use

    return [
        {"state_id": f"preflight::{i}", "state_messages": [{"role": "user", "content": "fix the failing test"}],
         "chosen": format_tool_use("Read", {"file_path": f"src/app_{i}.py"}),
         "rejected": format_tool_use("Bash", {"command": "ls"}), "n_teachers_agreeing": 2}
        for i in range(2)
    ]  # fmt: skip


class PreflightError(ValueError):
    """A later stage of the run cannot run; raised before replay sends anything."""


def _normalize(ctx: Any) -> None:
    nc = ctx.config.normalize
    if nc.skip_dj:
        return
    fix = f"{EXTRA_INSTALL.format(extra='data-juicer')}, or set normalize.skip_dj: true"
    try:
        from composer_replication.replaysim import DJNormalizer

        DJNormalizer(nc.recipe).normalize(_tiny_pairs())
    except (ImportError, RuntimeError) as exc:
        raise PreflightError(f"{_first_line(exc)} (fix: {fix})") from None


def _train(mode: str) -> Callable[[Any], None]:
    def check(ctx: Any) -> None:
        from composer_replication._extras import require

        require("hf", purpose=f"the {mode} training phase")
        if mode == "grpo":
            require("trl", purpose="the GRPO phase")
        try:  # imported, not only looked up: a broken install fails here too
            import torch  # noqa: F401
            import transformers  # noqa: F401

            if mode == "grpo":
                import datasets  # noqa: F401
                import trl  # noqa: F401
        except ImportError as exc:
            extra = "trl" if mode == "grpo" else "hf"
            raise PreflightError(f"{_first_line(exc)} (fix: {EXTRA_INSTALL.format(extra=extra)})") from None
        from composer_replication.pipeline.training import train_config

        train_config(ctx, mode)  # the trainer's own validation, and the student model resolved offline
        if mode == "grpo":
            _sandbox()

    return check


def _sandbox() -> None:
    from composer_replication.datagen.sandbox import SandboxError, make_sandbox

    try:
        with make_sandbox() as sb:
            r = sb.exec("true", timeout=60)
    except (SandboxError, OSError) as exc:
        raise PreflightError(f"no working sandbox: {_first_line(exc)}") from None
    if r.returncode != 0:
        raise PreflightError(f"the sandbox cannot run `true` (exit {r.returncode}): {r.output.strip()[:200]}")


def _evaluate(ctx: Any) -> None:
    if ctx.config.evaluate.sandbox_tasks:
        _sandbox()


def _report(ctx: Any) -> None:
    from composer_replication._extras import require

    require("plot", purpose="the report")
    import matplotlib  # noqa: F401  (imported: a broken install fails here, not after paying)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


CHECKS: dict[str, Callable[[Any], None]] = {
    "normalize": _normalize,
    "train_offline": _train("offline"),
    "train_grpo": _train("grpo"),
    "evaluate": _evaluate,
    "report": _report,
}


def check_later_stages(ctx: Any, stage_names: list[str]) -> None:
    """Run the checks of ``stage_names`` (enabled stages after replay); ``PreflightError`` lists all failures."""
    problems = []
    for name in stage_names:
        check = CHECKS.get(name)
        if check is None:
            continue
        try:
            check(ctx)
        except Exception as exc:  # noqa: BLE001 - each stage's problem is reported, with the others
            problems.append(f"  {name}: " + " ".join(str(exc).split()))
    if problems:
        raise PreflightError(
            "a later stage of this run cannot run, so replay sent nothing (no money spent):\n"
            + "\n".join(problems)
        )
