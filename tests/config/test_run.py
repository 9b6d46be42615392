"""The run config: validation with located errors, path resolution, overrides, examples, generated docs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from composer_replication.pipeline.config import RunConfig, load_run_config

REPO = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_current():
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_config_docs.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    committed = (REPO / "docs" / "configuration.md").read_text()
    assert out.stdout == committed, (
        "docs/configuration.md is stale: python3 scripts/gen_config_docs.py > docs/configuration.md"
    )
    for key in ("replay.teachers[]", "train.optimizer", "train.loss.sdpo", "grpo", "evaluate"):
        assert f"## `{key}`" in committed


def test_relative_paths_and_overrides(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run_dir: out\nsources: {paths: [logs, /abs/x]}\nreplay: {max_total_usd: 2}\n")
    c = load_run_config(cfg, {"replay.max_total_usd": 0.5, "train.schedule.max_steps": 3})
    assert c.run_dir == str(tmp_path / "out")
    assert c.sources.paths == [str(tmp_path / "logs"), "/abs/x"]
    assert c.replay.max_total_usd == 0.5 and c.train.schedule.max_steps == 3


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("replay: {max_total_usd: -1}", "replay.max_total_usd"),
        ("replay: {teachers: [{slug: x, backend: transformers}]}", "needs `model_path`"),
        ("train: {optimizr: {}}", "train.optimizr"),
        ("train: {data: {traces: bad.yaml}}", "set by the pipeline"),
        ("grpo: {tasks: 3}", "grpo.tasks"),
        ("- a list", "expected a mapping"),
        ("a: [", "not valid YAML"),
    ],
)
def test_bad_configs_name_file_and_field(tmp_path, text, needle):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text + "\n")
    text = text.replace("bad.yaml", str(cfg))
    cfg.write_text(text + "\n")
    with pytest.raises(ValueError) as exc:
        load_run_config(cfg)
    assert needle in str(exc.value) and str(cfg) in str(exc.value)


def test_section_hash_tracks_only_its_sections():
    a, b = RunConfig(), RunConfig.model_validate({"report": {"title": "x"}})
    assert a.section_hash("replay", "train") == b.section_hash("replay", "train")
    assert a.section_hash("report") != b.section_hash("report")


def test_examples_validate():
    for name in ("cpu.yaml", "gpu.yaml"):
        c = load_run_config(REPO / "examples" / name)
        assert c.replay.teachers and c.replay.max_total_usd > 0
    from composer_replication.cli.launch import _load

    assert _load(str(REPO / "examples" / "diloco_modal.yaml"))["store"]["type"] == "s3"


def test_demo_configs():
    from composer_replication.pipeline import demo_config

    full, fast = demo_config(), demo_config(fast=True)
    assert full.student.name == "default" and fast.student.name == "tiny"
    assert all(t.backend == "transformers" for t in full.replay.teachers + fast.replay.teachers)
    assert all(Path(p).is_dir() for p in full.sources.paths)
    assert full.grpo.enabled and full.replay.max_total_usd == 0.0


def test_grpo_settings_have_one_place_and_old_files_still_load(tmp_path):
    new = tmp_path / "new.yaml"
    new.write_text(
        "train: {schedule: {max_steps: 5}}\ngrpo: {enabled: true, max_steps: 2, lr: 0.001, objective: dapo, num_generations: 3}\n"
    )
    old = tmp_path / "old.yaml"
    old.write_text("train: {schedule: {max_steps: 5}, grpo: {objective: dapo, num_generations: 3}}\n"
                   "grpo: {enabled: true, max_steps: 2, lr: 0.001}\n")  # fmt: skip
    assert load_run_config(new) == load_run_config(old)
    rc = load_run_config(new)
    assert "grpo" not in type(rc.train).model_fields
    (tmp_path / "p.jsonl").write_text("{}\n")
    (tmp_path / "t.jsonl").write_text("{}\n")
    online = rc.train_config("grpo", model="m", traces=None, pairs=str(tmp_path / "p.jsonl"))
    assert (online.mode, online.model.path, online.data.pairs) == ("grpo", "m", tmp_path / "p.jsonl")
    assert (online.grpo.objective, online.grpo.num_generations) == ("dapo", 3)
    assert online.schedule.max_steps == 2 and online.optimizer.lr == 0.001  # the phase's own
    offline = rc.train_config("offline", model="m", traces=str(tmp_path / "t.jsonl"), pairs=None)
    assert offline.schedule.max_steps == 5 and offline.optimizer.lr == rc.train.optimizer.lr
    clash = tmp_path / "clash.yaml"
    clash.write_text("train: {grpo: {objective: dapo}}\ngrpo: {objective: gspo}\n")
    with pytest.raises(ValueError, match=r"move train.grpo.objective .*grpo.objective") as exc:
        load_run_config(clash)
    assert str(clash) in str(exc.value)


def test_online_phase_warmup_is_its_own_and_never_swallows_the_phase(tmp_path):
    """HF warm-up starts at lr 0: a phase that ends inside it would train at (almost) nothing, so it is
    rejected naming the field that set it; ``grpo.warmup_steps`` overrides the offline phase's."""
    (tmp_path / "p.jsonl").write_text("{}\n")
    inherited = tmp_path / "inherited.yaml"
    inherited.write_text("train: {schedule: {warmup_steps: 3}}\ngrpo: {enabled: true, max_steps: 1}\n")
    with pytest.raises(ValueError, match=r"train.schedule.warmup_steps=3 with grpo.max_steps=1") as exc:
        load_run_config(inherited)
    assert str(inherited) in str(exc.value) and "grpo.warmup_steps" in str(exc.value)
    own = tmp_path / "own.yaml"
    own.write_text(
        "train: {schedule: {warmup_steps: 3}}\ngrpo: {enabled: true, max_steps: 4, warmup_steps: 4}\n"
    )
    with pytest.raises(ValueError, match=r"grpo.warmup_steps=4 with grpo.max_steps=4"):
        load_run_config(own)
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(
        "train: {schedule: {warmup_steps: 3}}\ngrpo: {enabled: true, max_steps: 1, warmup_steps: 0}\n"
    )
    rc = load_run_config(fixed)
    online = rc.train_config("grpo", model="m", traces=None, pairs=str(tmp_path / "p.jsonl"))
    assert (online.schedule.warmup_steps, online.schedule.max_steps) == (0, 1)
    offline = rc.train_config("offline", model="m", traces=None, pairs=str(tmp_path / "p.jsonl"))
    assert offline.schedule.warmup_steps == 3
    # a long enough phase keeps the offline phase's warm-up (examples/cpu.yaml: 3 of 10 steps)
    long = load_run_config(REPO / "examples" / "cpu.yaml")
    assert (
        long.train_config(
            "grpo", model="m", traces=None, pairs=str(tmp_path / "p.jsonl")
        ).schedule.warmup_steps
        == 3
    )
    from composer_replication.pipeline import demo_config

    assert demo_config().grpo.warmup_steps == demo_config(fast=True).grpo.warmup_steps == 0  # a 1-step phase


def test_online_phase_batch_size_is_its_own(tmp_path):
    """``grpo.batch_size`` sets the task prompts per online step (the TRL batch is that times the group
    size); unset, the offline phase's ``train.schedule.batch_size``."""
    (tmp_path / "p.jsonl").write_text("{}\n")
    own = tmp_path / "own.yaml"
    own.write_text("train: {schedule: {batch_size: 2}}\ngrpo: {enabled: true, max_steps: 2, batch_size: 1}\n")
    rc = load_run_config(own)
    pairs = str(tmp_path / "p.jsonl")
    assert rc.train_config("grpo", model="m", traces=None, pairs=pairs).schedule.batch_size == 1
    assert rc.train_config("offline", model="m", traces=None, pairs=pairs).schedule.batch_size == 2
    inherited = tmp_path / "inherited.yaml"
    inherited.write_text("train: {schedule: {batch_size: 2}}\ngrpo: {enabled: true, max_steps: 2}\n")
    rc = load_run_config(inherited)
    assert rc.train_config("grpo", model="m", traces=None, pairs=pairs).schedule.batch_size == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: {enabled: true, batch_size: 0}\n")
    with pytest.raises(ValueError, match=r"grpo.batch_size") as exc:
        load_run_config(bad)
    assert str(bad) in str(exc.value)
