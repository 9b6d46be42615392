"""Before replay pays for anything: check that every later stage of the run can run.

The replay stage is the only one that spends money; a stage after it that cannot run (a missing
extra, a module that extra forgot, a tracker without its key, no sandbox, no disk space, a bad
training section) would otherwise fail after the teacher calls were paid. So before its first call the
replay stage runs :func:`check_later_stages` over the enabled stages after it that this invocation
will run (up to ``run --until``, so replay and pairs can run on a machine without the training extras).
What can fail late, stage by stage, and what is checked for it:

- ``pairs`` (``pairs.recovery`` other than ``none``): torch imports (the recovery pairs are mined
  by the trainer's data code);
- ``normalize`` (unless ``normalize.skip_dj``): data-juicer imports with its install guard, the
  recipe loads, and a dry run over two tiny pairs (this imports ``data_juicer.core``, which needs
  ``ray``);
- ``train_offline``: torch and transformers import, the offline phase's trainer config builds and
  the student model resolves offline; every tracker of ``train.logging.report_to`` imports
  (``tensorboard``, ``wandb``, ``trackio``) and ``wandb`` has an API key (``WANDB_API_KEY``, a
  ``wandb login`` entry in the netrc file) or runs offline (``WANDB_MODE=offline``/``disabled``);
  ``train.logging.plot`` has matplotlib;
- ``train_grpo`` (``grpo.enabled``): the same, plus trl and datasets import, the GRPO phase's trainer
  config builds, the phase's tasks load (bundled names, or a task directory that already exists),
  ``grpo.vllm`` has vllm installed (and, in server mode, its server accepts a connection), and a
  sandbox starts and runs ``true``;
- ``evaluate``: torch and transformers import; with ``evaluate.sandbox_tasks``, the tasks exist and
  a sandbox starts and runs ``true``;
- ``mine_tasks``, ``eval_tasks_before``, ``eval_tasks_after`` (the ``tasks`` section): a sandbox starts
  and runs ``true`` (and the evaluations: torch and transformers import);
- ``report``: matplotlib imports;
- disk: the run directory's file system has room for the models the training stages write at the
  least (the merged ``final/`` model of each phase and the full-weight checkpoints they keep:
  ``train.checkpoint.keep_last`` of them, none for a LoRA offline phase); optimizer states and logs
  come on top, so passing this is necessary, not sufficient.

Every failure is collected and raised as one :class:`PreflightError` that names the stage, the
problem and the command or setting that fixes it. Not covered: failures that depend on the data the
later stages will see (e.g. no pair survives normalisation), or on resources at that time (memory).
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXTRA_INSTALL = "pip install torch==2.13.0 'composer-replication[{extra}]'"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _imports(extra: str, *modules: str) -> None:
    """Import ``modules`` (imported, not only looked up: a broken install fails here too)."""
    try:
        for m in modules:
            importlib.import_module(m)
    except ImportError as exc:
        raise PreflightError(f"{_first_line(exc)} (fix: {EXTRA_INSTALL.format(extra=extra)})") from None


# ----------------------------------------------------------------------------- per stage


def _pairs(ctx: Any) -> None:
    if ctx.config.pairs.recovery != "none":
        _imports("hf", "torch")


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
        _imports("trl" if mode == "grpo" else "hf", "torch", "transformers",
                 *(("datasets", "trl") if mode == "grpo" else ()))  # fmt: skip
        from composer_replication.pipeline.training import train_config

        train_config(ctx, mode)  # the trainer's own validation, and the student model resolved offline

    return check


def _tasks(ctx: Any) -> None:
    from composer_replication.pipeline.grpo_phase import task_rows
    from composer_replication.pipeline.training import grpo_tasks

    spec = grpo_tasks(ctx)
    if isinstance(spec, str) and not Path(spec).is_dir():
        return  # the run mines them first (mine_tasks)
    task_rows(spec)  # ValueError naming grpo.tasks and the bundled ones, or a directory without a task


def _evaluate_bundled(ctx: Any) -> None:
    names = ctx.config.grpo.tasks
    if ctx.config.evaluate.sandbox_tasks:
        from composer_replication.pipeline.grpo_phase import task_rows

        task_rows(names if isinstance(names, list) else [])
        _sandbox(ctx)


def _vllm(ctx: Any) -> None:
    vc = ctx.config.grpo.vllm
    if vc is None:
        return
    from composer_replication._extras import is_available

    if not is_available("vllm"):
        raise PreflightError(
            "grpo.vllm is set but vllm is not installed (fix: pip install vllm, or remove grpo.vllm)"
        )
    if vc.mode == "server":
        import socket
        from urllib.parse import urlsplit

        url = urlsplit(vc.server_url or "")
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname, port), timeout=5).close()
        except OSError as exc:
            raise PreflightError(
                f"grpo.vllm.server_url {vc.server_url}: no server accepts a connection ({exc.strerror or exc}) "
                "(fix: start `trl vllm-serve` there first, or fix grpo.vllm.server_url)"
            ) from None


def _sandbox(ctx: Any) -> None:
    if "sandbox" in ctx.state.get("preflight_ok", ()):
        return  # one start per preflight serves train_grpo and evaluate
    from composer_replication.datagen.sandbox import SandboxError, make_sandbox

    try:
        with make_sandbox() as sb:
            r = sb.exec("true", timeout=60)
    except (SandboxError, OSError) as exc:
        raise PreflightError(f"no working sandbox: {_first_line(exc)}") from None
    if r.returncode != 0:
        raise PreflightError(f"the sandbox cannot run `true` (exit {r.returncode}): {r.output.strip()[:200]}")
    ctx.state.setdefault("preflight_ok", set()).add("sandbox")


def _evaluate_models(ctx: Any) -> None:
    _imports("hf", "torch", "transformers")


def _plot(ctx: Any) -> None:
    if ctx.config.train.logging.plot:
        _matplotlib("train.logging.plot (losses.png)", "or set train.logging.plot: false")


def _report(ctx: Any) -> None:
    _matplotlib("the report", "")


def _matplotlib(purpose: str, alternative: str) -> None:
    from composer_replication._extras import MissingExtraError, require

    try:
        require("plot", purpose=purpose)
        import matplotlib  # noqa: F401  (imported: a broken install fails here, not after paying)
    except ImportError as exc:
        why = "not installed" if isinstance(exc, MissingExtraError) else _first_line(exc)
        fix = EXTRA_INSTALL.format(extra="plot") + (f", {alternative}" if alternative else "")
        raise PreflightError(f"{purpose} needs matplotlib ({why}) (fix: {fix})") from None


def check_trackers(ctx: Any) -> None:
    """Every ``train.logging.report_to`` tracker imports; wandb also has a key (or runs offline)."""
    problems = []
    for name in ctx.config.train.logging.report_to:
        module = {"tensorboard": "torch.utils.tensorboard"}.get(name, name)  # what the trainers import
        if name == "none":
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:
            problems.append(
                f"train.logging.report_to lists {name}, which does not import ({_first_line(exc)}) "
                f"(fix: pip install 'composer-replication[{name}]', or remove {name} from train.logging.report_to)"
            )
        if name == "wandb" and (why := wandb_credentials_missing()):
            problems.append(f"train.logging.report_to lists wandb, but {why}")
    if problems:
        raise PreflightError("; ".join(problems))


def wandb_credentials_missing(environ: Any = None) -> str | None:
    """Why ``wandb.init`` would stop for a key (None when it would not): no ``WANDB_API_KEY``, no entry for
    the W&B host in the netrc file (``$NETRC`` or ``~/.netrc``, which ``wandb login`` writes), and neither
    ``WANDB_MODE=offline``/``disabled`` nor ``WANDB_DISABLED``. Reads no key into any message."""
    import netrc
    from urllib.parse import urlsplit

    env = os.environ if environ is None else environ
    if env.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return None
    if env.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes"):
        return None
    if env.get("WANDB_API_KEY"):
        return None
    host = urlsplit(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(env.get("NETRC") or Path(env.get("HOME") or Path.home()) / ".netrc")
    try:
        auth = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        auth = None
    if auth and auth[2]:
        return None
    return (
        f"no W&B API key is found (WANDB_API_KEY is unset and {path} has no entry for {host}) "
        "(fix: export WANDB_API_KEY=..., run `wandb login`, or export WANDB_MODE=offline)"
    )


# stage -> its checks; each check's failure is one line of the error, every check runs
CHECKS: dict[str, tuple[Callable[[Any], None], ...]] = {
    "pairs": (_pairs,),
    "normalize": (_normalize,),
    "train_offline": (_train("offline"), check_trackers, _plot),
    "train_grpo": (_train("grpo"), check_trackers, _plot, _tasks, _vllm, _sandbox),
    "evaluate": (_evaluate_models, _evaluate_bundled),
    "mine_tasks": (_sandbox,),
    "eval_tasks_before": (_evaluate_models, _sandbox),
    "eval_tasks_after": (_evaluate_models, _sandbox),
    "report": (_report,),
}


# ----------------------------------------------------------------------------- disk


def weights_bytes(model_dir: Path) -> int:
    """Bytes of the weight files directly in ``model_dir`` (safetensors, bin, pt)."""
    try:
        return sum(
            p.stat().st_size for p in model_dir.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()
        )
    except OSError:
        return 0


def disk_needed(ctx: Any, stage_names: list[str]) -> tuple[int, int]:
    """(bytes, the student's weight bytes): a lower bound on what the training stages among
    ``stage_names`` write under the run directory (one copy of the weights per final model and kept
    full-weight checkpoint)."""
    from composer_replication.pipeline.training import student_dir

    if not {"train_offline", "train_grpo"} & set(stage_names):
        return 0, 0
    w = weights_bytes(student_dir(ctx))
    tc = ctx.config.train
    copies = 0
    if "train_offline" in stage_names:
        copies += 1 + (0 if tc.lora.enabled else tc.checkpoint.keep_last)  # final/ (merged) + checkpoints
    if "train_grpo" in stage_names:
        copies += 1 + tc.checkpoint.keep_last  # the online phase trains every weight
    return w * copies, w


def disk_problem(ctx: Any, stage_names: list[str]) -> str | None:
    need, w = disk_needed(ctx, stage_names)
    where = Path(ctx.run_dir)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if need <= free:
        return None
    gib = 2**30
    return (
        f"the training stages write at least {need / gib:.2f} GiB (the student's {w / gib:.2f} GiB of weights "
        f"once per final model and kept checkpoint) but {where} has {free / gib:.2f} GiB free (fix: free "
        "space there, use another run directory (--out), lower train.checkpoint.keep_last, or enable train.lora)"
    )


def check_later_stages(ctx: Any, stage_names: list[str]) -> None:
    """Run the checks of ``stage_names`` (enabled stages after replay); ``PreflightError`` lists all failures."""
    problems = []
    for name in stage_names:
        for check in CHECKS.get(name, ()):
            try:
                check(ctx)
            except Exception as exc:  # noqa: BLE001 - each problem is reported, with the others
                problems.append(f"  {name}: " + " ".join(str(exc).split()))
    if not any(p.startswith(("  train_offline:", "  train_grpo:")) for p in problems):
        try:  # the student resolved: how much its trained copies need
            disk = disk_problem(ctx, stage_names)
        except Exception as exc:  # noqa: BLE001
            disk = f"cannot measure the room the training stages need: {_first_line(exc)}"
        if disk:
            problems.append(f"  disk: {disk}")
    if problems:
        raise PreflightError(
            "a later stage of this run cannot run, so replay sent nothing (no money spent):\n"
            + "\n".join(problems)
        )
