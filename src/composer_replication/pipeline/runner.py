"""The stage runner: run each stage of a pipeline in order, skip what is current, resume what is not.

A stage declares the files it reads, the files it writes and the config sections it depends on. Before
running it the runner hashes those inputs and the sections; when the manifest holds the same hashes
and the outputs are unchanged on disk, the stage is skipped. Otherwise the stage runs again, and
resumes through its own caches (replay's response cache and spend ledger, the trainer's checkpoints,
evaluation's per-site cache), so nothing already computed or paid for is done twice.

One run at a time: the runner holds the run directory's lock (``RUN/.lock``, naming its pid) while it
runs, and refuses a directory whose manifest was written for another config file (``origin``) unless
told to take it over. After each stage it polls the kill switch, so a stop requested while a stage
that never polls was running (Ctrl-C during ``report``) still ends the run with the switch's exit code;
a stage whose summary says ``overrun`` (replay: a provider billed above its reservation) ends the run
with ``SpendOverrun`` once the stage is recorded.

Test hook: ``COMPOSER_REPLICATION_CRASH_AT=<stage>[:<n>]`` kills the process (``os._exit(113)``, as
abrupt as SIGKILL: no cleanup runs) inside that stage, at its ``n``-th consult of the run's `Stop` (a
poll or an observe; default: after its body returns, before the manifest records it as done).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_replication import wire
from composer_replication._io import hash_path
from composer_replication._lock import directory_lock
from composer_replication.config.run import RunConfig
from composer_replication.pipeline.manifest import Manifest
from composer_replication.safety.stop import NEVER, Stop, as_stop

CRASH_ENV = "COMPOSER_REPLICATION_CRASH_AT"
CRASH_EXIT_CODE = 113


@dataclass
class RunContext:
    """What a stage gets: the run directory, the config, the run's one `Stop` and a logger.

    ``stop`` is the run's kill switch (a `safety.Stop`; `NEVER` without one): stages poll it, feed it
    (``stop.observe(...)``) and pass it on as the ``stop=`` of what they call.
    """

    run_dir: Path
    config: RunConfig
    stop: Stop = NEVER
    log: Callable[[str], None] = print
    resume: bool = False  # the stage ran before with the same inputs and config: continue its partial work
    until: str | None = None  # the last stage this invocation runs (``run --until``); None: all of them
    stages: tuple[str, ...] = ()  # the run's enabled stages in order (the runner sets it)
    state: dict[str, Any] = field(default_factory=dict)

    def path(self, *parts: str) -> Path:
        return self.run_dir.joinpath(*parts)


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline. ``run`` returns a summary dict (counts, spend) kept in the manifest."""

    name: str
    sections: tuple[str, ...]
    inputs: Callable[[RunContext], Sequence[Path]]
    outputs: Callable[[RunContext], Sequence[Path]]
    run: Callable[[RunContext], dict[str, Any]]
    enabled: Callable[[RunConfig], bool] = lambda cfg: True
    description: str = ""


class StageFailed(RuntimeError):
    """A stage raised; the manifest records it as failed with the error text."""


def _crash_point(stage: str) -> int | None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return None
    name, _, n = spec.partition(":")
    if name != stage:
        return None
    return int(n) if n else 0


def _crash() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


class Runner:
    """Run ``stages`` over ``run_dir``; see the module docstring for the skip/resume rule."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        config: RunConfig,
        stages: Sequence[Stage],
        *,
        log: Callable[[str], None] = print,
        stop: Any = None,
        origin: str | None = None,
        take_over: bool = False,
    ) -> None:
        """``origin`` names what the config came from (its file); a run directory whose manifest names
        another origin is refused unless ``take_over``."""
        self.run_dir = Path(run_dir)
        self.config = config
        self.stages = list(stages)
        self.log = log
        self.stop = as_stop(stop)
        self.origin = origin
        self.take_over = take_over
        self._until: str | None = None
        self.manifest = Manifest.load(self.run_dir)

    def _key(self, ctx: RunContext, stage: Stage) -> tuple[str, dict[str, str | None]]:
        section = self.config.section_hash(*stage.sections)
        inputs = {
            str(p.relative_to(self.run_dir) if p.is_relative_to(self.run_dir) else p): hash_path(p)
            for p in stage.inputs(ctx)
        }
        return section, inputs

    def _outputs(self, ctx: RunContext, stage: Stage) -> dict[str, str | None]:
        return {str(p.relative_to(self.run_dir)): hash_path(p) for p in stage.outputs(ctx)}

    def is_current(self, stage: Stage, ctx: RunContext | None = None) -> bool:
        ctx = ctx or self._context()
        rec = self.manifest.stages.get(stage.name)
        if rec is None or rec.status != "done":
            return False
        section, inputs = self._key(ctx, stage)
        if rec.section_hash != section or rec.input_hashes != inputs:
            return False
        outputs = self._outputs(ctx, stage)
        return all(v is not None for v in outputs.values()) and outputs == rec.output_hashes

    def _context(self) -> RunContext:
        return RunContext(
            self.run_dir, self.config, stop=self.stop, log=self.log, until=self._until,
            stages=tuple(s.name for s in self.stages if s.enabled(self.config)),
        )  # fmt: skip

    def run(self, *, force: Sequence[str] = (), until: str | None = None) -> dict[str, str]:
        """Run the stages; returns ``{stage: "ran" | "skipped" | "disabled"}``.

        ``force`` re-runs the named stages even when current (their caches still apply). ``until``
        stops after the named stage.
        """
        names = [s.name for s in self.stages]
        for n in [*force, *([until] if until else [])]:
            if n not in names:
                raise ValueError(f"unknown stage {n!r}; stages are: {', '.join(names)}")
        self._until = until
        with directory_lock(self.run_dir, "run directory", f"touch {self.run_dir / 'STOP'}"):
            self.manifest = Manifest.load(self.run_dir)  # as the last holder of the lock left it
            self._check_origin()
            cfg_dump = self.config.model_dump(mode="json")
            self.manifest.set_run_info(cfg_dump, self.config.section_hash(*RunConfig.model_fields))
            if self.origin is not None:
                self.manifest.data["origin"] = self.origin
            for s in self.stages:
                self.manifest.stage(s.name)
            self.manifest.save()
            outcome: dict[str, str] = {}
            # every stage renders in the train section's wire format (training, GRPO, evaluation)
            with wire.use_format(self.config.train.data.wire_format):
                for stage in self.stages:
                    outcome[stage.name] = self._run_one(stage, force=stage.name in force)
                    self._halt_if_needed(stage, ran=outcome[stage.name] == "ran")
                    if stage.name == until:
                        break
        return outcome

    def _check_origin(self) -> None:
        old = self.manifest.data.get("origin")
        if self.origin is None or old is None or old == self.origin or self.take_over:
            return
        raise ValueError(
            f"{self.run_dir}: this run directory was created by {old}, not {self.origin}; running here would "
            "redo its stages and replace its outputs. Use another run directory, or pass --force to take it over"
        )

    def _halt_if_needed(self, stage: Stage, *, ran: bool) -> None:
        """Stop between stages: a stop requested meanwhile (signal, STOP file), or a spend overrun."""
        reason = self.stop()
        if reason:
            from composer_replication.safety.kill_switch import KillSwitchTriggered

            self.log(f"[{stage.name}] stopping after this stage: {reason}")
            raise KillSwitchTriggered(reason)
        summary = self.manifest.stage(stage.name).summary
        if ran and summary.get("overrun"):
            from composer_replication.teacher_replay.ledger import SpendOverrun

            raise SpendOverrun(
                f"[{stage.name}] spend overrun: the ledger books ${summary.get('spent_usd', 0):.6f} against a "
                f"${summary.get('max_total_usd', 0):.6f} cap, because a provider billed above the prices the "
                "reservations were made with (ledger entries marked overrun). The stage's results are kept; "
                "check the teacher prices, then rerun to continue with the later stages"
            )

    def _run_one(self, stage: Stage, *, force: bool) -> str:
        ctx = self._context()
        rec = self.manifest.stage(stage.name)
        if not stage.enabled(self.config):
            rec.status, rec.summary = "disabled", {}
            self.manifest.save()
            self.log(f"[{stage.name}] disabled by the config")
            return "disabled"
        if not force and self.is_current(stage, ctx):
            self.log(f"[{stage.name}] up to date, skipped")
            return "skipped"
        section, inputs = self._key(ctx, stage)
        ctx.resume = rec.attempts > 0 and rec.section_hash == section and rec.input_hashes == inputs
        rec.status, rec.error, rec.started_at, rec.finished_at = "running", None, time.time(), None
        rec.section_hash, rec.input_hashes, rec.attempts = section, inputs, rec.attempts + 1
        self.manifest.save()
        crash_at = _crash_point(stage.name)
        if crash_at:
            ctx.stop = _CrashingStop(ctx.stop, crash_at)
        self.log(
            f"[{stage.name}] running"
            + (f" (attempt {rec.attempts}, resuming from caches)" if rec.attempts > 1 else "")
        )
        t0 = time.time()
        try:
            summary = stage.run(ctx) or {}
        except BaseException as exc:
            rec.status, rec.finished_at = "failed", time.time()
            rec.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            self.manifest.save()
            raise
        if crash_at == 0:
            _crash()
        rec.summary = {**summary, "seconds": round(time.time() - t0, 2)}
        rec.output_hashes = self._outputs(ctx, stage)
        missing = [k for k, v in rec.output_hashes.items() if v is None]
        if missing:
            rec.status, rec.error = "failed", f"stage finished without writing {missing}"
            self.manifest.save()
            raise StageFailed(f"stage {stage.name!r} finished without writing {', '.join(missing)}")
        rec.status, rec.finished_at = "done", time.time()
        self.manifest.save()
        self.log(f"[{stage.name}] done in {rec.summary['seconds']:.1f}s " + _fmt_summary(summary))
        return "ran"


class _CrashingStop:
    """The run's `Stop`, crashing the process at its ``n``-th consult (a poll or an observe; test hook)."""

    def __init__(self, inner: Stop, n: int) -> None:
        self._inner, self._n, self._polls = inner, n, 0

    def _count(self) -> None:
        self._polls += 1
        if self._polls >= self._n:
            _crash()

    def __call__(self) -> str | None:
        self._count()
        return self._inner()

    def observe(self, **metrics: Any) -> str | None:
        self._count()
        return self._inner.observe(**metrics)


_SUMMARY_ITEMS = 10  # items of a stage's summary on its log line; `status` shows all


def _fmt_summary(summary: dict[str, Any]) -> str:
    parts = [
        f"{k}={v}" for k, v in summary.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)
    ]
    if len(parts) <= _SUMMARY_ITEMS:
        return " ".join(parts)
    more = len(parts) - _SUMMARY_ITEMS
    return " ".join(parts[:_SUMMARY_ITEMS]) + f" (+{more} more: composer-replication status RUN_DIR)"
