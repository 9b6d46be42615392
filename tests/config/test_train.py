"""The typed config: unknown keys, bounds, the PO menu and missing files fail with the field named,
before any model loads; the schema imports without torch/trl."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from composer_replication.config import ConfigError, TrainConfig, build_config, load_config


@pytest.fixture()
def data_files(tmp_path):
    (tmp_path / "pairs.jsonl").write_text("")
    (tmp_path / "traces.jsonl").write_text("")
    return tmp_path


def write_yaml(tmp_path, text: str):
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


def test_defaults_and_relative_paths(data_files):
    p = write_yaml(data_files, "data: {pairs: pairs.jsonl}\n")
    cfg = load_config(p)
    assert isinstance(cfg, TrainConfig)
    assert cfg.data.pairs == data_files / "pairs.jsonl"
    assert (
        cfg.grpo.objective == "dr_grpo" and cfg.loss.sdpo.weight == 0.1 and cfg.loss.preference.weight == 0.05
    )


def test_rpo_alpha_reaches_the_loss_and_the_grpo_trainer_arguments(data_files):
    from composer_replication.config.loss import RPO_ALPHA

    cfg = load_config(write_yaml(data_files, "data: {pairs: pairs.jsonl}\n"))
    assert cfg.loss.compose_loss_kwargs()["replay_rpo_alpha"] == RPO_ALPHA
    cfg = load_config(
        write_yaml(data_files, "data: {pairs: pairs.jsonl}\nloss: {preference: {rpo_alpha: 0}}\n")
    )
    assert cfg.loss.compose_loss_kwargs()["replay_rpo_alpha"] == 0.0


@pytest.mark.parametrize(
    "text, field, words",
    [
        ("data: {pairs: pairs.jsonl}\nbogus: 1\n", "bogus", "unknown key"),
        ("data: {pairs: pairs.jsonl}\nloss: {sdpo: {wieght: 1}}\n", "loss.sdpo.wieght", "unknown key"),
        (
            "data: {pairs: pairs.jsonl}\nloss: {sdpo: {type: taid, h_max: 2}}\n",
            "loss.sdpo.h_max",
            "unknown key",
        ),
        (
            "data: {pairs: pairs.jsonl}\nloss: {sdpo: {weight: -0.5}}\n",
            "loss.sdpo.weight",
            "greater than or equal to 0",
        ),
        (
            "data: {pairs: pairs.jsonl}\nloss: {preference: {weight: -1}}\n",
            "loss.preference.weight",
            "greater than",
        ),
        (
            "data: {pairs: pairs.jsonl}\nloss: {preference: {type: simpo, rpo_alpha: -1}}\n",
            "loss.preference.rpo_alpha",
            "greater than or equal to 0",
        ),
        ("data: {pairs: pairs.jsonl}\ngrpo: {objective: ppo}\n", "grpo.objective", "dr_grpo"),
        ("data: {pairs: missing.jsonl}\n", "data.pairs", "file not found"),
        ("data: {}\n", "(top level)", "data.traces and/or data.pairs"),
        (
            "data: {pairs: pairs.jsonl}\nschedule: {max_steps: 0}\n",
            "schedule.max_steps",
            "greater than or equal to 1",
        ),
        ("data: {pairs: pairs.jsonl}\nloss: {sdpo: {type: bogus}}\n", "loss.sdpo", "'taid'"),
        ("data: {pairs: pairs.jsonl}\nloss: {sdpo: {wrapper: bogus}}\n", "loss.sdpo", "old name"),
    ],
)
def test_bad_configs_name_the_field(data_files, text, field, words):
    with pytest.raises(ConfigError) as err:
        load_config(write_yaml(data_files, text))
    msg = str(err.value)
    assert f"  {field}:" in msg and words in msg and "cfg.yaml" in msg


@pytest.mark.parametrize(
    "text, line",
    [
        ("optimizer: {lrr: 1}", "optimizer.lrr: unknown key 'lrr' in optimizer; did you mean 'lr'?"),
        ("optimizer: {learning_rate: 1}", "unknown key 'learning_rate' in optimizer; did you mean 'lr'?"),
        ("schedul: {}", "schedul: unknown key 'schedul' at the top level; did you mean 'schedule'?"),
        # the variant chosen by `type` is where the nearest key is looked for
        ("loss: {sdpo: {type: taid, t_strat: 0.4}}", "loss.sdpo.t_strat: unknown key 't_strat' in loss.sdpo; "
         "did you mean 't_start'?"),
        ("loss: {preference: {type: simpo, gama: 1}}", "did you mean 'gamma'?"),
        ("lora: {zzz: 1}", "unknown key 'zzz' in lora (check the spelling; see docs/training.md"),
    ],
)  # fmt: skip
def test_a_misspelt_key_gets_the_nearest_one(data_files, text, line):
    with pytest.raises(ConfigError) as exc:
        load_config(write_yaml(data_files, "data: {pairs: pairs.jsonl}\n" + text + "\n"))
    assert line in str(exc.value)


def test_a_misspelt_run_config_key_gets_the_nearest_one(tmp_path):
    from composer_replication.config import load_run_config

    p = tmp_path / "run.yaml"
    p.write_text("sorces: {}\nreplay: {teachers: [{slug: a, base_ulr: x}]}\ntrain: {optimizer: {lrr: 1}}\n")
    with pytest.raises(ConfigError) as exc:
        load_run_config(p)
    text = str(exc.value)
    assert "sorces: unknown key 'sorces' at the top level; did you mean 'sources'?" in text
    assert (
        "replay.teachers.0.base_ulr: unknown key 'base_ulr' in replay.teachers.0; did you mean 'base_url'?"
        in text
    )
    assert "train.optimizer.lrr: unknown key 'lrr' in train.optimizer; did you mean 'lr'?" in text


def test_variants_are_chosen_by_type_and_old_keys_still_load(data_files):
    def loss(text):
        return load_config(write_yaml(data_files, "data: {pairs: pairs.jsonl}\nloss: " + text + "\n")).loss

    new = loss("{sdpo: {type: taid, t_start: 0.3}, preference: {type: simpo, beta: 3.0, gamma: 0.5}}")
    old = loss(
        "{sdpo: {wrapper: taid, taid: {t_start: 0.3}}, "
        "preference: {variant: simpo, simpo_beta: 3.0, simpo_gamma: 0.5, dpo_beta: 0.1}}"
    )
    assert new == old and new.sdpo.t_start == 0.3 and new.preference.gamma == 0.5
    # what the losses take, derived from the variant
    assert (new.sdpo.wrapper, new.preference.variant, new.preference.simpo_beta) == ("taid", "simpo", 3.0)
    eopd = loss("{sdpo: {wrapper: entropy_opd, entropy_opd_h_max: 2.5}}").sdpo
    assert eopd.type == "entropy_opd" and eopd.entropy_opd_h_max == 2.5 and eopd.wrapper == "entropy_opd"
    plain = loss("{sdpo: {wrapper: none, taid: {t_start: 0.4}}, preference: {dpo_beta: 0.2}}")
    assert plain.sdpo.type == "gjsd" and plain.sdpo.wrapper == "none" and plain.preference.dpo_beta == 0.2
    # an old knob that the chosen variant lacks, set away from its default: the error names the new key
    for text, needle in [
        ("{sdpo: {taid: {t_start: 0.3}}}", "sdpo: {type: taid, t_start"),
        ("{sdpo: {entropy_opd_h_max: 2.0}}", "{type: entropy_opd, h_max"),
        ("{preference: {simpo_beta: 3.0}}", "preference: {type: simpo, beta: 3.0}"),
        ("{sdpo: {type: taid, wrapper: taid}}", "set `type` only"),
    ]:
        with pytest.raises(ConfigError, match="loss.sdpo|loss.preference") as err:
            loss(text)
        assert needle in str(err.value)


def test_toml_json_and_overrides(data_files):
    (data_files / "c.toml").write_text(
        'mode = "grpo"\n[data]\npairs = "pairs.jsonl"\n[grpo]\nobjective = "dapo"\n'
    )
    cfg = load_config(data_files / "c.toml", {"schedule.max_steps": 7, "grpo.objective": "gspo"})
    assert cfg.mode == "grpo" and cfg.schedule.max_steps == 7 and cfg.grpo.objective == "gspo"
    (data_files / "c.json").write_text(
        json.dumps({"data": {"traces": "traces.jsonl"}, "optimizer": {"lr": 0.5}})
    )
    assert load_config(data_files / "c.json").optimizer.lr == 0.5
    with pytest.raises(ConfigError, match="optimizer.lr"):
        load_config(data_files / "c.json", {"optimizer.lr": -1})
    with pytest.raises(FileNotFoundError):
        load_config(data_files / "nope.yaml")


def test_embeddable_and_round_trips(data_files):
    cfg = build_config({"data": {"pairs": str(data_files / "pairs.jsonl")}})
    again = TrainConfig.model_validate(cfg.model_dump(mode="json"))
    assert again == cfg
    assert TrainConfig.model_fields["loss"].description is None or True  # nested models documented per field
    assert all(f.description for f in type(cfg.loss.sdpo).model_fields.values())


def test_schema_and_trainer_package_import_without_torch_or_trl():
    code = (
        "import sys, composer_replication.config, composer_replication.trainer;"
        "from composer_replication.trainer.grpo import objectives;"
        "bad = [m for m in ('torch', 'trl', 'transformers') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_rejects_bad_config_before_loading_a_model(data_files, monkeypatch, capsys):
    from composer_replication import models
    from composer_replication.cli.main import main

    def boom(*a, **k):
        raise AssertionError("a model was loaded for an invalid config")

    monkeypatch.setattr(models, "build_tiny_model", boom)
    monkeypatch.setattr(models, "load_default_model", boom)
    p = write_yaml(data_files, "data: {pairs: pairs.jsonl}\nloss: {sdpo: {weight: -1}}\nextra_key: 2\n")
    assert main(["train", str(p), "--out", str(data_files / "run")]) == 1
    err = capsys.readouterr().err
    assert "loss.sdpo.weight" in err and "extra_key" in err
    assert not (data_files / "run").exists()
    assert main(["validate", str(p)]) == 1
    good = write_yaml(data_files, "data: {pairs: pairs.jsonl}\n")
    assert main(["validate", str(good)]) == 0
    assert "ok" in capsys.readouterr().out
