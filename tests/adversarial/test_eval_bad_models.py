"""`eval --model` and the run's `tasks` section given hostile or broken input: each is one line naming the
model or field, nothing is loaded that should not be, no traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tasks"))
from _taskdir import write_tasks  # noqa: E402

from composer_replication.cli.main import main  # noqa: E402
from composer_replication.config import ConfigError  # noqa: E402
from composer_replication.config.run import load_run_config  # noqa: E402


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("t") / "T")


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "files, needle",
    [
        ({}, "no config.json or adapter_config.json"),
        ({"adapter_config.json": "{not json"}, "no readable base_model_name_or_path"),
        ({"adapter_config.json": json.dumps({"r": 8})}, "no readable base_model_name_or_path"),
        ({"adapter_config.json": json.dumps({"base_model_name_or_path": "/nonexistent/base"})},
         "a LoRA adapter over '/nonexistent/base', which is not on this machine"),
    ],
)  # fmt: skip
def test_a_broken_model_directory_is_one_line(tasks, tmp_path, capsys, files, needle):
    model = tmp_path / "model"
    model.mkdir()
    for name, text in files.items():
        (model / name).write_text(text)
    assert main(["eval", str(tasks), "--model", str(model), "--out", str(tmp_path / "o")]) == 1
    assert needle in _err(capsys)
    assert not (tmp_path / "o" / "eval.json").exists()


def test_other_schemes_are_not_endpoints(tasks, tmp_path, capsys):
    for spec in ("file:///etc/passwd", "ftp://127.0.0.1/v1"):
        assert main(["eval", str(tasks), "--model", spec, "--out", str(tmp_path)]) == 1
        assert "not `default`, `tiny`, a model or adapter directory" in _err(capsys)


@pytest.mark.parametrize(
    "section, needle",
    [
        ({"sessions": ["logs"], "dir": "T"}, "not both"),
        ({"dir": "nowhere"}, "no such task directory"),
        ({"repo_map": ["/old"]}, "expected OLD=NEW"),
        ({"samples": 0}, "tasks.samples"),
        ({"harness": "cursor"}, "tasks.harness"),
        ({"max_turn": 3}, "tasks.max_turn"),
    ],
)
def test_the_tasks_section_names_the_bad_field(tasks, tmp_path, section, needle):
    (tmp_path / "logs").mkdir()
    (tmp_path / "T").symlink_to(tasks)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"tasks": section}))
    with pytest.raises(ConfigError, match=needle):
        load_run_config(tmp_path / "run.yaml")


def test_grpo_tasks_naming_a_missing_directory_is_refused_at_load(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"grpo": {"tasks": "gone"}}))
    with pytest.raises(ConfigError, match="gone: no such task directory"):
        load_run_config(tmp_path / "run.yaml")
