"""The replica config schema and its loader: one module, one error type naming file and field."""

from __future__ import annotations

import pytest

from composer_replication.config import ConfigError
from composer_replication.diloco.replica_config import (
    LocalStoreConfig,
    ReplicaConfig,
    S3StoreConfig,
    load_replica_config,
    parse_replica_config,
)


def test_loads_yaml_toml_and_json_alike(tmp_path):
    (tmp_path / "a.yaml").write_text("run_id: r\nstore: {type: local, root: /x}\nrounds: 2\n")
    (tmp_path / "a.toml").write_text('run_id = "r"\nrounds = 2\n[store]\ntype = "local"\nroot = "/x"\n')
    (tmp_path / "a.json").write_text('{"run_id": "r", "rounds": 2, "store": {"type": "local", "root": "/x"}}')
    configs = [load_replica_config(tmp_path / f"a.{ext}") for ext in ("yaml", "toml", "json")]
    assert configs[0] == configs[1] == configs[2]
    assert isinstance(configs[0].store, LocalStoreConfig) and configs[0].rounds == 2


def test_errors_name_the_file_and_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_id: r\nstore: {type: s3, bukket: b}\ninner_steps: 0\n")
    with pytest.raises(ConfigError) as info:
        load_replica_config(bad)
    text = str(info.value)
    assert str(bad) in text and "store.bukket: unknown key" in text and "docs/diloco.md" in text
    assert "inner_steps" in text and "store.bucket" in text  # the missing required field too
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_replica_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_replica_config(["not", "a", "mapping"], source="inline")


def test_store_sections_are_typed_and_pass_through():
    cfg = parse_replica_config({"store": {"type": "s3", "bucket": "b", "prefix": "p"}})
    assert isinstance(cfg.store, S3StoreConfig) and cfg.store.model_dump()["bucket"] == "b"
    assert parse_replica_config(cfg) is cfg
    assert ReplicaConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # what launch ships


def test_class_names_do_not_clash_with_the_training_config():
    import composer_replication.config.train as training
    import composer_replication.diloco.replica_config as replica

    assert not set(replica.__all__) & set(vars(training))
