"""The stage runner's skip / resume / invalidation rules, on small stages written out here."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from composer_replication._io import hash_path
from composer_replication.pipeline.config import RunConfig
from composer_replication.pipeline.manifest import Manifest
from composer_replication.pipeline.runner import CRASH_ENV, CRASH_EXIT_CODE, Runner, Stage


def _stages(calls: list[str]) -> list[Stage]:
    def first(ctx):
        calls.append("first")
        n = int(ctx.config.replay.max_states or 3)
        ctx.path("a").mkdir(exist_ok=True)
        ctx.path("a", "out.txt").write_text("x" * n)
        return {"n": n}

    def second(ctx):
        calls.append("second")
        text = ctx.path("a", "out.txt").read_text()
        ctx.path("b.txt").write_text(text.upper())
        return {"len": len(text)}

    return [
        Stage("first", ("replay",), lambda ctx: [], lambda ctx: [ctx.path("a", "out.txt")], first),
        Stage(
            "second",
            ("report",),
            lambda ctx: [ctx.path("a", "out.txt")],
            lambda ctx: [ctx.path("b.txt")],
            second,
        ),
    ]


def test_second_run_skips_everything(tmp_path):
    calls: list[str] = []
    cfg = RunConfig()
    assert Runner(tmp_path, cfg, _stages(calls), log=lambda m: None).run() == {
        "first": "ran",
        "second": "ran",
    }
    assert Runner(tmp_path, cfg, _stages(calls), log=lambda m: None).run() == {
        "first": "skipped",
        "second": "skipped",
    }
    assert calls == ["first", "second"]
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["stages"]["second"]["summary"]["len"] == 3
    assert m["stages"]["first"]["output_hashes"]["a/out.txt"] == hash_path(tmp_path / "a" / "out.txt")
    assert m["config"]["replay"]["max_total_usd"] == 5.0
    assert m["versions"]["python"]


def test_config_section_change_reruns_only_dependents(tmp_path):
    calls: list[str] = []
    Runner(tmp_path, RunConfig(), _stages(calls), log=lambda m: None).run()
    # report section only feeds "second"
    cfg = RunConfig.model_validate({"report": {"title": "other"}})
    assert Runner(tmp_path, cfg, _stages(calls), log=lambda m: None).run() == {
        "first": "skipped",
        "second": "ran",
    }
    # replay section feeds "first"; its new output changes the input hash of "second"
    cfg = RunConfig.model_validate({"report": {"title": "other"}, "replay": {"max_states": 5}})
    assert Runner(tmp_path, cfg, _stages(calls), log=lambda m: None).run() == {
        "first": "ran",
        "second": "ran",
    }
    assert (tmp_path / "b.txt").read_text() == "XXXXX"


def test_edited_output_is_detected(tmp_path):
    calls: list[str] = []
    Runner(tmp_path, RunConfig(), _stages(calls), log=lambda m: None).run()
    (tmp_path / "b.txt").write_text("tampered")
    assert Runner(tmp_path, RunConfig(), _stages(calls), log=lambda m: None).run() == {
        "first": "skipped",
        "second": "ran",
    }
    assert (tmp_path / "b.txt").read_text() == "XXX"


def test_failure_is_recorded_and_rerun_resumes(tmp_path):
    calls: list[str] = []
    boom = {"on": True}

    def flaky(ctx):
        calls.append(f"flaky resume={ctx.resume}")
        if boom["on"]:
            raise ValueError("disk on fire")
        ctx.path("c.txt").write_text("ok")
        return {}

    stages = [
        *_stages(calls),
        Stage("third", ("seed",), lambda ctx: [ctx.path("b.txt")], lambda ctx: [ctx.path("c.txt")], flaky),
    ]
    with pytest.raises(ValueError, match="disk on fire"):
        Runner(tmp_path, RunConfig(), stages, log=lambda m: None).run()
    rec = Manifest.load(tmp_path).stages["third"]
    assert rec.status == "failed" and "disk on fire" in rec.error and rec.attempts == 1
    boom["on"] = False
    out = Runner(tmp_path, RunConfig(), stages, log=lambda m: None).run()
    assert out == {"first": "skipped", "second": "skipped", "third": "ran"}
    assert calls[-2:] == ["flaky resume=False", "flaky resume=True"]
    assert Manifest.load(tmp_path).stages["third"].status == "done"


def test_stage_that_forgets_an_output_fails(tmp_path):
    bad = Stage("bad", (), lambda ctx: [], lambda ctx: [ctx.path("never.txt")], lambda ctx: {})
    with pytest.raises(RuntimeError, match="never.txt"):
        Runner(tmp_path, RunConfig(), [bad], log=lambda m: None).run()


def test_unknown_stage_names_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown stage 'nope'"):
        Runner(tmp_path, RunConfig(), _stages([]), log=lambda m: None).run(force=["nope"])


def test_crash_hook_kills_the_process_before_the_stage_is_recorded(tmp_path):
    """The env hook exits abruptly (no cleanup); the manifest still shows the stage as running."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_runner import _stages
        from composer_replication.pipeline.config import RunConfig
        from composer_replication.pipeline.runner import Runner
        Runner({str(tmp_path)!r}, RunConfig(), _stages([]), log=print).run()
        """
    )
    env = {**__import__("os").environ, CRASH_ENV: "second"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == CRASH_EXIT_CODE, proc.stderr
    m = Manifest.load(tmp_path)
    assert m.stages["first"].status == "done" and m.stages["second"].status == "running"
    out = Runner(tmp_path, RunConfig(), _stages([]), log=lambda m: None).run()
    assert out == {"first": "skipped", "second": "ran"}


def test_status_of_a_directory_that_is_not_a_run(tmp_path, capsys):
    from composer_replication.cli.main import main

    assert main(["status", str(tmp_path)]) == 1
    assert "no manifest.json" in capsys.readouterr().err


def test_status_reads_a_partial_run(tmp_path, capsys):
    from composer_replication.cli.main import main

    calls: list[str] = []
    Runner(tmp_path, RunConfig(), _stages(calls), log=lambda m: None).run(until="first")
    assert main(["status", str(tmp_path), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["stages"]["first"]["status"] == "done" and st["stages"]["second"]["status"] == "pending"
    assert st["spend_usd"] == 0.0 and st["report"] is None and st["last_checkpoint"] is None


def test_a_long_summary_line_says_what_it_left_out_and_status_keeps_it_all(tmp_path):
    def many(ctx):
        ctx.path("m.txt").write_text("m")
        return {f"k{i:02d}": i for i in range(13)}

    lines: list[str] = []
    Runner(tmp_path, RunConfig(), [Stage("many", (), lambda c: [], lambda c: [c.path("m.txt")], many)],
           log=lines.append).run()  # fmt: skip
    done = next(line for line in lines if line.startswith("[many] done"))
    assert "k09=9" in done and "k10=" not in done
    assert done.endswith("k09=9 (+3 more: composer-replication status RUN_DIR)")  # 13 items, 10 shown
    assert Manifest.load(tmp_path).stages["many"].summary["k12"] == 12


def test_each_stage_sees_the_runs_enabled_stage_names(tmp_path):
    seen: list[tuple[str, ...]] = []

    def one(ctx):
        seen.append(ctx.stages)
        ctx.path("one.txt").write_text("1")
        return {}

    stages = [
        Stage("one", (), lambda c: [], lambda c: [c.path("one.txt")], one),
        Stage("off", (), lambda c: [], lambda c: [], one, enabled=lambda cfg: False),
    ]
    Runner(tmp_path, RunConfig(), stages, log=lambda m: None).run()
    assert seen == [("one",)]


def test_replay_outside_the_runner_refuses_before_paying(tmp_path):
    """Without the run's stage list the later stages cannot be checked first, so replay refuses (fail closed)."""
    from composer_replication.pipeline.replay_stages import replay_stage
    from composer_replication.pipeline.runner import RunContext

    with pytest.raises(ValueError, match="inside the pipeline's Runner"):
        replay_stage(RunContext(tmp_path, RunConfig()))
    assert not (tmp_path / "replay").exists()  # nothing written, nothing sent
