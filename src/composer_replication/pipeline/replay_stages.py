"""The replay, pairs and normalize stages of ``composer-replication run`` (``pipeline.stages`` lists them).

    replay/     states.jsonl (references into split/) teacher_calls.jsonl cache.jsonl ledger.jsonl
    pairs/      raw_pairs.jsonl per_teacher.json
    normalize/  pairs.jsonl

Replay checks the later stages before anything is paid for, sends the selected training states to the
teachers under the dollar cap (the cache and ledger make a rerun free), and releases in-process teachers.
Ctrl-C or SIGTERM during the checks (which import data-juicer, build models and start a sandbox, and
never poll the stop) ends them at once (`interruptible`); during the calls, replay's own waits end
within about a second (``teacher_replay.waits``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, cast

from composer_replication._io import atomic_write_json, read_jsonl, write_jsonl_atomic
from composer_replication.pipeline.runner import RunContext
from composer_replication.pipeline.training import resolve_model

if TYPE_CHECKING:
    from composer_replication.teacher_replay.types import DPOPair, TeacherCallResult, TeacherSpec, TraceState


def teacher_specs(ctx: RunContext) -> list[TeacherSpec]:
    """The config's teachers as ``TeacherSpec`` dicts (in-process model paths resolved)."""
    from composer_replication.teacher_replay import DEFAULT_TEACHERS

    if not ctx.config.replay.teachers:
        return [cast("TeacherSpec", dict(t)) for t in DEFAULT_TEACHERS]
    out: list[TeacherSpec] = []
    for t in ctx.config.replay.teachers:
        d = t.model_dump(exclude_none=True, exclude={"model_seed"})
        if t.backend == "transformers":
            d["model_path"] = str(resolve_model(t.model_path or "", t.model_seed, ctx.path("models")))
        out.append(cast("TeacherSpec", d))
    return out


def replay_refs(ctx: RunContext) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The state references the replay stage sends (header, rows): the config's selection, and
    ``history_messages`` as each reference's ``last`` (the reader keeps the system message and the last N)."""
    from composer_replication.ingestion.store import read_refs
    from composer_replication.trainer.evaluation.greedy import is_error_site

    rc = ctx.config.replay
    head, rows = read_refs(ctx.path("split", "train_states.jsonl"))
    refs = list(rows)
    if rc.states == "error_sites":
        refs = [s for s in refs if is_error_site(s)]
    if rc.max_states is not None:
        refs = refs[: rc.max_states]
    if rc.history_messages is not None:
        refs = [{**s, "last": rc.history_messages} for s in refs]
    return head, refs


def replay_selection(ctx: RunContext) -> list[TraceState]:
    """The states the replay stage sends, materialised (``TraceState`` rows)."""
    from composer_replication.ingestion.store import open_store

    head, refs = replay_refs(ctx)
    return cast(
        "list[TraceState]", list(open_store(head, ctx.path("split", "train_states.jsonl")).states(refs))
    )


def replay_stage(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.ingestion.store import write_refs
    from composer_replication.pipeline.preflight import check_later_stages
    from composer_replication.teacher_replay.client import replay_states

    rc = ctx.config.replay
    names = list(ctx.stages)
    if "replay" not in names:  # fail closed: without the run's stages nothing could be checked before paying
        raise ValueError(
            "replay_stage runs inside the pipeline's Runner, which lists the run's stages in RunContext.stages "
            "so the later ones are checked before any call is paid for; use run_pipeline or `composer-replication run`"
        )
    last = names.index(ctx.until) if ctx.until in names else len(names) - 1
    with interruptible(ctx.stop):
        check_later_stages(ctx, names[names.index("replay") + 1 : last + 1])  # before anything is paid for
        head, refs = replay_refs(ctx)
        write_refs(
            ctx.path("replay", "states.jsonl"), head, refs, src=ctx.path("split", "train_states.jsonl")
        )
        states = replay_selection(ctx)
        teachers = teacher_specs(ctx)  # in-process teachers' models resolved (a tiny one is built)
        _load_local_teachers(ctx, states, teachers)
    rep = asyncio.run(
        replay_states(
            states, teachers, max_total_usd=rc.max_total_usd, cache_path=ctx.path("replay", "cache.jsonl"),
            ledger_path=ctx.path("replay", "ledger.jsonl"), concurrency=rc.concurrency, max_tokens=rc.max_tokens,
            stop=ctx.stop, progress=True,
        )
    )  # fmt: skip
    _release_local_teachers()
    write_jsonl_atomic(ctx.path("replay", "teacher_calls.jsonl"), rep.results)
    summary = {
        "states": len(states),
        "calls": len(rep.results),
        "cached": rep.n_cached,
        "sent": rep.n_sent,
        "errors": rep.n_errors,
        "spent_usd": round(rep.total_usd, 6),
    }
    if rep.overrun:  # the runner ends the run once this stage is recorded (SpendOverrun)
        summary.update(overrun=True, max_total_usd=rep.max_total_usd)
    return summary


def _load_local_teachers(ctx: RunContext, states: list[TraceState], teachers: list[TeacherSpec]) -> None:
    """Load the models of the in-process teachers that have calls to send, here, where a stop ends the
    load at once (a load begun in the backend's worker thread runs to its end)."""
    from composer_replication.teacher_replay.client import price_run

    local = [t for t in teachers if t.get("backend") == "transformers"]
    if not local:
        return
    todo = price_run(states, local, max_tokens=ctx.config.replay.max_tokens,
                     cache_path=ctx.path("replay", "cache.jsonl"))["per_teacher"]  # fmt: skip
    from composer_replication.teacher_replay.backends.transformers_local import preload

    for t in local:
        if todo.get(t["slug"], {}).get("calls"):
            preload(str(t.get("model_path")))


class _Interrupted(BaseException):
    """Raised by `interruptible`'s signal handler; a BaseException, so no ``except Exception`` keeps it."""


@contextlib.contextmanager
def interruptible(stop: Any) -> Iterator[None]:
    """While the body runs, SIGINT and SIGTERM end it at once with ``KillSwitchTriggered``.

    For code that never polls the stop (imports, model building, a sandbox start). The handler that
    was installed (the run's kill switch, which records the signal) runs first; then the body is
    interrupted where it is. Only in the main thread, and only over handlers that are Python callables
    (without a kill switch SIGINT already raises KeyboardInterrupt at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    active = [True]

    def handler(signum: int, frame: Any) -> None:
        # the kill switch records the signal (and a second Ctrl-C raises KeyboardInterrupt there)
        previous[signum](signum, frame)
        if active[0]:
            raise _Interrupted(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        old = signal.getsignal(sig)
        if callable(old):
            previous[sig] = old
            signal.signal(sig, handler)
    try:
        yield
    except _Interrupted as exc:
        from composer_replication.safety.kill_switch import KillSwitchTriggered

        raise KillSwitchTriggered(stop() or f"signal: {signal.Signals(exc.args[0]).name}") from None
    finally:
        active[0] = False
        for signum, old in previous.items():
            signal.signal(signum, old)


def _release_local_teachers() -> None:
    """Drop in-process teacher models once replay is done: training needs the memory more.

    The transformers backend keeps loaded models in a module-level cache for the life of the process;
    it has no public unload yet, so clear that cache (only if the backend was used at all).
    """
    import sys

    mod = sys.modules.get("composer_replication.teacher_replay.backends.transformers_local")
    if mod is not None and hasattr(mod, "_MODELS"):
        mod._MODELS.clear()
        import gc

        gc.collect()


def pairs_stage(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.ingestion.store import read_states
    from composer_replication.teacher_replay import extract_dpo_pairs, save_pairs
    from composer_replication.teacher_replay.actions import canonical_action

    states = cast("list[TraceState]", list(read_states(ctx.path("replay", "states.jsonl"))))
    calls = cast("list[TeacherCallResult]", list(read_jsonl(ctx.path("replay", "teacher_calls.jsonl"))))
    pairs = extract_dpo_pairs(states, calls, agreement_threshold=ctx.config.pairs.agreement_threshold)
    recovery = _recovery_pairs(ctx)
    save_pairs([*pairs, *recovery], ctx.path("pairs", "raw_pairs.jsonl"))
    per_teacher = {t["slug"]: 0 for t in teacher_specs(ctx)}
    by_state: dict[str, list[TeacherCallResult]] = {}
    for c in calls:
        by_state.setdefault(c["state_id"], []).append(c)
    for p in pairs:  # credit every teacher in the agreeing majority
        want = canonical_action(p["chosen"])
        for c in by_state.get(p["state_id"], []):
            if c.get("error") is None and canonical_action(c.get("response_text")) == want:
                per_teacher[c["teacher_slug"]] = per_teacher.get(c["teacher_slug"], 0) + 1
    atomic_write_json(ctx.path("pairs", "per_teacher.json"), per_teacher)
    out = {"states": len(states), "pairs": len(pairs)}
    if ctx.config.pairs.recovery != "none":
        out["recovery_pairs"] = len(recovery)
    return out


def _recovery_pairs(ctx: RunContext) -> list[DPOPair]:
    """Teacher-free pairs (``pairs.recovery``) from the training split's traces: held-out traces never
    reach training through them."""
    from composer_replication.ingestion.store import read_rows
    from composer_replication.trainer.data import recovery_pairs

    where = ctx.config.pairs.recovery
    if where == "none":
        return []
    traces = list(read_rows(ctx.path("split", "train_traces.jsonl")))
    sides: tuple[Literal["failure", "recovery"], ...] = (
        ("failure", "recovery") if where == "both" else (where,)
    )
    return [cast("DPOPair", p) for at in sides for p in recovery_pairs(traces, at=at)]


def normalize_stage(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.replaysim import DJNormalizer

    nc = ctx.config.normalize
    raw = list(read_jsonl(ctx.path("pairs", "raw_pairs.jsonl")))
    norm = DJNormalizer(nc.recipe, skip_dj=nc.skip_dj)
    out = norm.normalize(raw)
    write_jsonl_atomic(ctx.path("normalize", "pairs.jsonl"), (dataclasses.asdict(p) for p in out))
    dropped = getattr(getattr(norm, "last_report", None), "dropped_by_op", {}) or {}
    return {"pairs_in": len(raw), "pairs_out": len(out), **{f"dropped_by_{k}": v for k, v in dropped.items()}}
