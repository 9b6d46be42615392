"""The stages of ``composer-replication run`` and the glue between them.

Each stage is a thin call into the library (ingestion, teacher_replay, replaysim, trainer, datagen)
with fixed file names in the run directory, so the runner can hash inputs and outputs:

    ingest/        parts/ states.jsonl traces.jsonl sessions.jsonl ingest_stats.json   (secrets redacted here;
                   each session stored once in parts/, the .jsonl files reference it: ingestion.store)
    split/         train_states.jsonl train_traces.jsonl heldout_states.jsonl      (references into ingest/)
    replay/        teacher_calls.jsonl  cache.jsonl ledger.jsonl   (cache + ledger make reruns free;
    pairs/         raw_pairs.jsonl per_teacher.json                 replay, pairs and normalize:
    normalize/     pairs.jsonl (NormalizedDPOPair rows)             ``pipeline.replay_stages``)
    train/offline/ final/ checkpoints metrics.jsonl
    train/grpo/    final/ checkpoints metrics.jsonl
    eval/          eval.json generations.jsonl
    tasks/         mined/ eval_before/ eval_after/ before_after.json   (``tasks`` section: ``pipeline.task_stages``)
    report/        report.html *.png
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_json
from composer_replication.config.run import RunConfig
from composer_replication.pipeline.replay_stages import (
    normalize_stage,
    pairs_stage,
    replay_selection,
    replay_stage,
    teacher_specs,
)
from composer_replication.pipeline.runner import RunContext, Runner, Stage
from composer_replication.pipeline.task_stages import (
    eval_after_stage,
    eval_before_stage,
    mine_stage,
    task_dir,
    tasks_enabled,
)
from composer_replication.pipeline.training import (
    final_model_dir,
    sandbox_pass_rate,
    student_dir,
    train_grpo_stage,
    train_offline_stage,
)

# ----------------------------------------------------------------------------- ingest + split


def _ingest(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.ingestion import ingest_paths

    src = ctx.config.sources
    if not src.paths:
        raise ValueError(
            "sources.paths is empty: list your session files or directories (e.g. ~/.claude/projects)"
        )
    # Incremental: the runner decided this stage must run (inputs, config or outputs changed); ingest_paths
    # re-reads only the session files that changed and rewrites every output (a fresh ingest gives the same).
    stats = ingest_paths(src.paths, ctx.path("ingest"), redact=src.redact, progress=True)
    totals = stats.get("totals", {})
    keep = ("n_states_emitted", "n_examples", "n_tool_errors")
    return {
        "files": len(stats.get("files", [])),
        **{k: v for k, v in totals.items() if k in keep},
        "secrets_redacted": sum((totals.get("redactions") or {}).values()),
    }


def trace_of(state_id: str) -> str:
    return state_id.split("::")[0]


def _split(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.ingestion.store import EXAMPLES_FORMAT, read_refs, write_refs
    from composer_replication.trainer.evaluation.greedy import is_error_site

    src = ctx.config.sources
    # References only: nothing is materialised to split (each row names its trace; error sites carry error_kind).
    states_path, traces_path = ctx.path("ingest", "states.jsonl"), ctx.path("ingest", "traces.jsonl")
    s_head, s_rows = read_refs(states_path)
    t_head, t_rows = read_refs(traces_path, EXAMPLES_FORMAT)
    states, traces = list(s_rows), list(t_rows)
    ids = sorted({trace_of(s["state_id"]) for s in states} | {t["trace_id"] for t in traces})
    if src.heldout_traces:
        unknown = sorted(set(src.heldout_traces) - set(ids))
        if unknown:
            raise ValueError(f"sources.heldout_traces: {unknown} not among the ingested traces {ids}")
        held = set(src.heldout_traces)
    else:

        def u(t: str) -> float:  # a stable hash in [0, 1): the split never depends on file order
            return int(hashlib.sha256(f"{ctx.config.seed}:{t}".encode()).hexdigest()[:8], 16) / 2**32

        held = {t for t in ids if u(t) < src.heldout_fraction}
        if not held and src.heldout_fraction > 0 and len(ids) > 1:
            held = {min(ids, key=u)}
    sites = [s for s in states if trace_of(s["state_id"]) in held and is_error_site(s)]
    train = [s for s in states if trace_of(s["state_id"]) not in held]
    write_refs(ctx.path("split", "train_states.jsonl"), s_head, train, src=states_path)
    write_refs(ctx.path("split", "heldout_states.jsonl"), s_head, sites, src=states_path)
    train_ex = [t for t in traces if t["trace_id"] not in held]
    write_refs(ctx.path("split", "train_traces.jsonl"), t_head, train_ex, src=traces_path)
    from composer_replication.pipeline.learning import heldout_traces
    from composer_replication.trainer.error_sites import error_sites

    return {
        "traces": len(ids),
        "heldout_traces": len(held),
        "train_states": len(train),
        # the sites the before/after evaluation measures: each failed tool call of a held-out session that
        # the agent answered (a recorded recovery), once
        "heldout_error_sites": len(error_sites(heldout_traces(ctx.run_dir), need_hint=False)),
    }


# ----------------------------------------------------------------------------- evaluate + report


def _evaluate(ctx: RunContext) -> dict[str, Any]:
    from itertools import islice

    from composer_replication.ingestion.store import read_states
    from composer_replication.trainer.evaluation.greedy import GreedyGenerator, evaluate_sites

    ec = ctx.config.evaluate
    sites = list(islice(read_states(ctx.path("split", "heldout_states.jsonl")), ec.max_sites))
    cache = ctx.path("eval", "generations.jsonl")
    result: dict[str, Any] = {
        "note": "Recovery at held-out error sites: valid = an answer that ended within the token budget and is a well-formed action; tool match = same tool sequence as the "
        "recorded recovery; exact = same canonical action as the recorded recovery.",
        "heldout_sites": len(sites),
    }
    for phase, model in (("before", student_dir(ctx)), ("after", final_model_dir(ctx))):
        gen: Any = (
            GreedyGenerator(
                model, cache, max_new_tokens=ec.max_new_tokens, max_prompt_tokens=ec.max_prompt_tokens
            )
            if sites
            else lambda st: ("", True)  # evaluate.max_sites 0: no separate greedy answers (nothing is called)
        )
        result[phase] = {"model": str(model), **evaluate_sites(gen, sites, stop=ctx.stop)}
        if ec.sandbox_tasks:
            result[phase].update(sandbox_pass_rate(ctx, model))
    from composer_replication.pipeline.learning import heldout_traces
    from composer_replication.trainer.evaluation.paired import site_comparison

    result["sites"] = site_comparison(
        heldout_traces(ctx.run_dir), student_dir(ctx), final_model_dir(ctx),
        max_len=ec.max_prompt_tokens, max_new_tokens=ec.max_new_tokens,
    )  # fmt: skip
    atomic_write_json(ctx.path("eval", "eval.json"), result)
    # one evaluation: the paired comparison at every held-out error site and the sandbox tasks, each with
    # its n; the greedy answers at the first evaluate.max_sites sites are samples to read (report, eval.json)
    out: dict[str, Any] = {"heldout_error_sites": (result["sites"] or {}).get("n_sites", 0)}
    for m, v in ((result["sites"] or {}).get("metrics") or {}).items():
        out[m] = f"{v['before']:.4f}->{v['after']:.4f} (n={v['n']})"
    before, after = result["before"].get("sandbox_pass_rate"), result["after"].get("sandbox_pass_rate")
    if before is not None and after is not None:
        n = result["after"].get("sandbox_scored")
        out["sandbox_pass_rate"] = f"{before:.3f}->{after:.3f} (n={n} tasks)"
    out["sample_answers"] = len(sites)
    return out


def _report(ctx: RunContext) -> dict[str, Any]:
    from composer_replication.pipeline.report import write_report

    path = write_report(ctx.run_dir, title=ctx.config.report.title)
    return {"report": str(path.relative_to(ctx.run_dir))}


# ----------------------------------------------------------------------------- the pipeline


def _p(*parts: str):  # an inputs/outputs function over fixed run-dir paths
    return lambda ctx: [ctx.path(*x.split("/")) for x in parts]


def _tasks_in(ctx: RunContext) -> list[Path]:  # the run's task directory, when it has one
    d = task_dir(ctx.config, ctx.run_dir)
    return [d] if d is not None else []


# A declared table (tests/test_layers.py allows it past the function-length cap): one ``Stage(...)`` row per
# stage, in run order, and nothing else; a stage's logic lives in the function its row names.
def build_stages() -> list[Stage]:
    """The stages in order. Each names the config sections that decide its output (its cache key)."""
    return [
        Stage(
            "ingest",
            ("sources",),
            lambda ctx: [Path(p) for p in ctx.config.sources.paths],
            _p(
                "ingest/states.jsonl",
                "ingest/traces.jsonl",
                "ingest/sessions.jsonl",
                "ingest/ingest_stats.json",
            ),
            _ingest,
            description="parse sessions, redact secrets",
        ),
        Stage(
            "split",
            ("sources", "seed"),
            _p("ingest/states.jsonl", "ingest/traces.jsonl"),
            _p("split/train_states.jsonl", "split/train_traces.jsonl", "split/heldout_states.jsonl"),
            _split,
            description="hold out traces for evaluation",
        ),
        Stage(
            "replay",
            ("replay",),
            _p("split/train_states.jsonl"),
            _p("replay/states.jsonl", "replay/teacher_calls.jsonl"),
            replay_stage,
            description="teachers answer each error site, under the spend cap",
        ),
        Stage(
            "pairs",
            ("replay", "pairs"),
            _p("replay/states.jsonl", "replay/teacher_calls.jsonl", "split/train_traces.jsonl"),
            _p("pairs/raw_pairs.jsonl", "pairs/per_teacher.json"),
            pairs_stage,
            description="consensus preference pairs (and recovery pairs: pairs.recovery)",
        ),
        Stage(
            "normalize",
            ("normalize",),
            _p("pairs/raw_pairs.jsonl"),
            _p("normalize/pairs.jsonl"),
            normalize_stage,
            description="data-juicer dedup and filters",
        ),
        Stage(
            "mine_tasks",
            ("tasks",),
            lambda ctx: [Path(p) for p in ctx.config.tasks.sessions],
            _p("tasks/mined"),
            mine_stage,
            enabled=lambda cfg: bool(cfg.tasks.sessions),
            description="tasks from your sessions and their repositories, validated in the sandbox",
        ),
        Stage(
            "eval_tasks_before",
            ("student", "tasks"),
            _tasks_in,
            _p("tasks/eval_before/eval.json"),
            eval_before_stage,
            enabled=tasks_enabled,
            description="the student on your tasks",
        ),
        Stage(
            "train_offline",
            ("student", "train"),
            _p("split/train_traces.jsonl", "normalize/pairs.jsonl"),
            _p("train/offline/final"),
            train_offline_stage,
            description="SFT + SDPO + DPO",
        ),
        Stage(
            "train_grpo",
            ("student", "train", "grpo"),
            lambda ctx: [ctx.path("train", "offline", "final"), *_tasks_in(ctx)],
            _p("train/grpo/final"),
            train_grpo_stage,
            enabled=lambda cfg: cfg.grpo.enabled,
            description="GRPO on sandbox tasks",
        ),
        Stage(
            "evaluate",
            ("student", "evaluate", "grpo", "train"),
            lambda ctx: [
                ctx.path("split", "heldout_states.jsonl"),
                ctx.path("split", "train_traces.jsonl"),
                final_model_dir(ctx),
            ],
            _p("eval/eval.json"),
            _evaluate,
            description="held-out recovery and sandbox pass rate, before/after",
        ),
        Stage(
            "eval_tasks_after",
            ("student", "train", "grpo", "tasks"),
            lambda ctx: [*_tasks_in(ctx), final_model_dir(ctx), ctx.path("tasks", "eval_before", "eval.json")],
            _p("tasks/eval_after/eval.json", "tasks/before_after.json"),
            eval_after_stage,
            enabled=tasks_enabled,
            description="the trained model on your tasks, paired with the student",
        ),
        Stage(
            "report",
            ("report",),
            _p("eval/eval.json", "pairs/per_teacher.json", "replay/teacher_calls.jsonl", "train",
               "tasks/before_after.json"),  # fmt: skip
            _p("report/report.html"),
            _report,
            description="report.html with plots",
        ),
    ]


def make_kill_switch(run_dir: Path) -> Any:
    """The run's kill switch: a ``STOP`` file in the run directory, SIGTERM/SIGINT, training health.

    The dollar cap is not here: replay's ledger enforces it before each call (a switch tripping at
    "spend >= cap" would also stop the training stages of a run whose replay used its whole budget).
    """
    from composer_replication.safety.kill_switch import KillSwitch

    return KillSwitch(stop_file=run_dir / "STOP", log_path=run_dir / "kill_switch.jsonl")


def run_pipeline(
    config: RunConfig,
    run_dir: str | Path,
    *,
    force: tuple[str, ...] | list[str] = (),
    until: str | None = None,
    log: Any = print,
    origin: str | None = None,
    take_over: bool = False,
) -> Path | None:
    """Run (or resume) the whole pipeline in ``run_dir``; returns the report path once written.

    ``origin`` names the config's source (its file); a run directory created from another origin is
    refused unless ``take_over`` (see ``Runner``).
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(
            f"{run_dir}: is a file; the run directory must be a directory (pass another --out)"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    ks = make_kill_switch(run_dir)
    try:
        Runner(
            run_dir, config, build_stages(), log=log, stop=ks, origin=origin, take_over=take_over
        ).run(force=force, until=until)
    finally:
        ks.close()
    report = run_dir / "report" / "report.html"
    return report if report.exists() else None


def price_replay(
    config: RunConfig,
    run_dir: str | Path,
    *,
    log: Any = print,
    origin: str | None = None,
    take_over: bool = False,
) -> dict[str, Any]:
    """Run ingest and split, then price the replay stage without sending anything (``run --dry-run``).

    Calls already in the run's cache are excluded: the figure is what ``run`` would pay from here.
    """
    from composer_replication.teacher_replay.client import price_run

    run_dir = Path(run_dir)  # the runner refuses a file (NotADirectoryError) and a busy directory
    Runner(run_dir, config, build_stages(), log=log, origin=origin, take_over=take_over).run(until="split")
    ctx = RunContext(run_dir, config, log=log)
    states = replay_selection(ctx)
    return {"states": len(states), "max_total_usd": config.replay.max_total_usd,
            **price_run(states, teacher_specs(ctx), max_tokens=config.replay.max_tokens,
                        cache_path=ctx.path("replay", "cache.jsonl"))}  # fmt: skip
