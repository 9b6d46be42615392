"""The one GRPO builder: rows from traces of every source, every config field honoured or rejected,
online SDPO from a reward's hints, pairs as JSON text."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402

from composer_replication.config import ConfigError, build_config  # noqa: E402
from composer_replication.trainer.grpo.build import check_grpo_config, dataset_rows, grpo_args  # noqa: E402
from composer_replication.trainer.grpo.run import build_rows  # noqa: E402


def _cfg(tmp_path, **sections):
    traces = tmp_path / "t.jsonl"
    traces.write_text("{}\n")
    data = {"mode": "grpo", "data": {"traces": str(traces)}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return build_config(data)


def test_traces_from_every_source_make_one_dataset(ingested):
    """Claude Code's Bash input is a string, Codex's shell input a list: raw rows do not make an Arrow
    table ("cannot mix list and non-list"); the builder's rows do, and keep every value."""
    from composer_replication.ingestion import read_examples
    from composer_replication.trainer.data import recovery_pairs

    traces = list(read_examples(ingested / "traces.jsonl"))
    assert {t["source"] for t in traces} == {"claude_code", "codex"}
    rows = build_rows(traces, recovery_pairs(traces))
    assert any(r.get("dpo_pair") for r in rows) and any(r.get("error_kind") for r in rows)
    with pytest.raises(Exception, match="cannot mix|Could not convert|ArrowInvalid|ArrowTypeError"):
        Dataset.from_list([r for r in rows if r.get("error_meta")])
    ds = Dataset.from_list(dataset_rows(rows))
    assert len(ds) == len(rows) and set(ds.column_names) >= {"prompt", "error_meta", "dpo_pair", "error_kind"}
    for got, want in zip(ds, rows):
        if want.get("error_meta") is not None:
            assert json.loads(got["error_meta"]) == json.loads(json.dumps(want["error_meta"], default=str))
        if want.get("dpo_pair") is not None:
            assert json.loads(got["dpo_pair"])["chosen"] == want["dpo_pair"]["chosen"]
        assert [m["content"] for m in got["prompt"]] == [m["content"] for m in want["prompt"]]


@pytest.mark.parametrize(
    "section, value, field",
    [
        ("loss", {"label_smoothing": 0.1}, "loss.label_smoothing"),
        ("data", {"eval_fraction": 0.2}, "data.eval_fraction"),
        ("loss", {"sdpo": {"source": "recorded"}}, "loss.sdpo.source"),
        ("loss", {"sdpo": {"on_policy": {"max_new_tokens": 8}}}, "loss.sdpo.on_policy"),
        ("grpo", {"overrides": {"learning_rate": 0.1}}, "grpo.overrides.learning_rate: set optimizer.lr"),
        ("grpo", {"overrides": {"not_a_field": 1}}, "grpo.overrides.not_a_field"),
    ],
)
def test_unhonoured_fields_are_rejected_by_name(tmp_path, section, value, field):
    cfg = _cfg(tmp_path, **{section: value})
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        check_grpo_config(cfg)


def test_pipeline_phase_leaves_offline_fields_to_the_offline_phase(tmp_path):
    cfg = _cfg(tmp_path, loss={"label_smoothing": 0.1}, data={"eval_fraction": 0.2})
    check_grpo_config(cfg, pipeline=True)
    for pipeline in (False, True):  # TAID runs online too (its t follows the GRPO steps)
        check_grpo_config(_cfg(tmp_path, loss={"sdpo": {"type": "taid"}}), pipeline=pipeline)


def test_every_mapped_field_reaches_trl(tmp_path):
    cfg = _cfg(
        tmp_path,
        model={"dtype": "bfloat16"},
        optimizer={"type": "sgd", "lr": 0.02, "weight_decay": 0.1, "betas": [0.8, 0.9], "grad_clip": None},
        schedule={"type": "constant", "warmup_steps": 3, "max_steps": 7, "batch_size": 3, "grad_accum": 2},
        checkpoint={"every_steps": 0, "keep_last": 4},
        grpo={"objective": "dapo", "num_generations": 2, "max_completion_length": 12, "temperature": 0.7,
              "overrides": {"top_p": 0.9}},
        logging={"log_every": 2, "progress": False},
        seed=5,
    )  # fmt: skip
    a = grpo_args(cfg, tmp_path, cuda=False)
    assert (a.optim, a.learning_rate, a.weight_decay, a.adam_beta1, a.adam_beta2) == (
        "sgd",
        0.02,
        0.1,
        0.8,
        0.9,
    )
    assert a.max_grad_norm == 0.0 and a.lr_scheduler_type == "constant_with_warmup" and a.warmup_steps == 3
    assert (a.max_steps, a.per_device_train_batch_size, a.gradient_accumulation_steps) == (7, 6, 2)
    assert (a.num_generations, a.max_completion_length, a.temperature, a.top_p) == (2, 12, 0.7, 0.9)
    assert a.loss_type == "dapo" and a.bf16 and a.seed == 5 and a.logging_steps == 2
    assert (a.save_steps, a.save_total_limit) == (7, 4)  # every_steps 0: a checkpoint at the end only
    cosine = grpo_args(_cfg(tmp_path, schedule={"type": "cosine"}), tmp_path, cuda=False)
    assert cosine.lr_scheduler_type == "cosine" and cosine.optim == "adamw_torch" and not cosine.bf16


def _online_run(tok, out, args_kw=None, resume=None, **trainer_kw):
    import torch

    from composer_replication.models import build_tiny_model
    from composer_replication.trainer import ComposerReplicationTrainer, make_po_config

    def reward(completions, **_):
        reward.last_hints = [("read the file first" if i % 2 == 0 else None) for i in range(len(completions))]
        reward.last_parts = [{"format": 1.0, "runs": i % 2} for i in range(len(completions))]
        reward.last_hack_attempts = 1  # one completion touched a protected file (datagen.verifier)
        return [float(i % 3) for i in range(len(completions))]

    pair = {
        "state_id": "s::0",
        "state_messages": [{"role": "user", "content": "list"}],
        "chosen": "a",
        "rejected": "b",
    }
    rows = dataset_rows([{"prompt": [{"role": "user", "content": "fix it"}], "dpo_pair": pair}])
    kw = {"save_strategy": "no", "max_steps": 1, **(args_kw or {})}
    args = make_po_config("dr_grpo", output_dir=str(out), use_cpu=True, report_to="none",
                          per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                          logging_steps=1, seed=0, disable_tqdm=True, **kw)  # fmt: skip
    seen = {}

    class Spy(ComposerReplicationTrainer):
        def _compute_loss(self, model, inputs):
            seen["rows"] = inputs["sdpo_loss_mask"].sum(-1).gt(0).tolist()
            return super()._compute_loss(model, inputs)

    torch.manual_seed(0)
    tok.padding_side = "left"
    t = Spy(model=build_tiny_model(tokenizer=tok), reward_funcs=reward, args=args,
            train_dataset=Dataset.from_list(rows), processing_class=tok, **trainer_kw)  # fmt: skip
    t.train(resume_from_checkpoint=resume)
    return seen["rows"], t.state.log_history[0]


def test_online_sdpo_from_a_reward_that_names_failed_calls(tiny_tokenizer, tmp_path):
    """A reward publishing ``last_hints`` turns on the hinted teacher for exactly those completions; a
    pair travelling as JSON text is decoded for the DPO channel; a shaped reward's parts and reward-hack
    attempts are logged."""
    rows, log = _online_run(tiny_tokenizer, tmp_path, alpha_sdpo=1.0, beta_replay=1.0)
    assert sum(rows) == 2  # the two hinted completions (TRL shuffles rows before the loss)
    assert log["sdpo/tokens"] > 0 and log["pref/pairs"] == 1
    assert log["reward_parts/format"] == 1.0 and log["reward_parts/runs"] == 0.5
    assert log["reward_hack_attempts"] == 1.0


def test_sdpo_wrapper_reaches_the_grpo_trainer(tiny_tokenizer, tmp_path):
    _, gjsd = _online_run(tiny_tokenizer, tmp_path / "a", alpha_sdpo=1.0, beta_replay=0.0)
    _, eopd = _online_run(tiny_tokenizer, tmp_path / "b", alpha_sdpo=1.0, beta_replay=0.0,
                          sdpo_wrapper="entropy_opd", entropy_opd_h_max=2.0)  # fmt: skip
    assert gjsd["sdpo/tokens"] == eopd["sdpo/tokens"] > 0  # same samples (seeded), another divergence
    assert gjsd["sdpo/loss"] != eopd["sdpo/loss"]
    with pytest.raises(ValueError, match="sdpo_taid"):
        _online_run(tiny_tokenizer, tmp_path / "c", alpha_sdpo=1.0, sdpo_wrapper="taid")


def test_taid_schedule_follows_the_grpo_steps_and_resumes(tiny_tokenizer, tmp_path):
    from composer_replication.distillation import TAIDScheduler

    def run(out, taid, resume=None):
        return _online_run(tiny_tokenizer, out, args_kw={"max_steps": 2, "save_strategy": "steps", "save_steps": 1},
                           resume=resume, alpha_sdpo=1.0, beta_replay=0.0, sdpo_wrapper="taid", sdpo_taid=taid)  # fmt: skip

    taid = TAIDScheduler(2, t_start=0.4, t_end=0.9)
    _, log = run(tmp_path / "a", taid)
    assert log["sdpo/taid_t"] == 0.4 and log["sdpo/tokens"] > 0  # step 1 runs at t_start
    assert taid.t == 0.9  # step 2's update: the linear floor reaches t_end at max_steps
    saved = json.loads((tmp_path / "a" / "checkpoint-1" / "taid_state.json").read_text())
    assert saved["t"] == 0.4 and math.isfinite(saved["prev_loss"])  # step 1 stored its loss
    fresh = TAIDScheduler(2, t_start=0.4, t_end=0.9)
    run(tmp_path / "a", fresh, resume=str(tmp_path / "a" / "checkpoint-1"))
    assert fresh.t == 0.9  # resumed with step 1's state, step 2 advanced it as in the run above


def test_validate_and_run_config_name_the_rejected_fields(tmp_path, capsys):
    import yaml

    from composer_replication.cli.main import main
    from composer_replication.pipeline.config import load_run_config

    traces = tmp_path / "t.jsonl"
    traces.write_text("{}\n")
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump({"mode": "grpo", "data": {"traces": str(traces)}, "loss": {"label_smoothing": 0.1}})
    )
    assert main(["validate", str(path)]) == 1
    assert "loss.label_smoothing" in capsys.readouterr().err
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"grpo": {"enabled": True, "reward": {"type": "tool_format"}}}))
    with pytest.raises(ValueError, match=r"grpo\.reward: the GRPO phase scores with the sandbox"):
        load_run_config(run)
    run.write_text(yaml.safe_dump({"grpo": {"enabled": True}, "train": {"loss": {"label_smoothing": 0.1}}}))
    assert load_run_config(run).train.loss.label_smoothing == 0.1  # the offline phase's field
