"""The replay / pairs / normalize subcommands through the real console entry point."""

from __future__ import annotations

import json

import pytest

from composer_replication._io import read_jsonl, write_jsonl_atomic
from composer_replication.cli.main import main
from composer_replication.teacher_replay.fake_server import Reply

from ..teacher_replay._replay_inputs import make_states

READ = '[TOOL_USE] name=Read input={"file_path": "a.py"}'


def test_replay_pairs_normalize_cli(fake_openrouter, tmp_path, capsys):
    srv = fake_openrouter
    srv.script = lambda info: Reply(text="hm") if info.model == "t/c" else Reply(text=READ)
    states = tmp_path / "states.jsonl"
    write_jsonl_atomic(states, make_states(4))
    out = tmp_path / "run"
    base = ["replay", str(states), "--out", str(out), "--base-url", srv.base_url, "--max-usd", "0.5",
            "--teachers", "t/a=1:4", "t/b=1:4", "t/c=1:4", "--no-progress"]  # fmt: skip

    assert main([*base, "--dry-run"]) == 0
    priced = json.loads(capsys.readouterr().out)
    assert priced["calls_to_send"] == 12 and priced["worst_case_usd"] > priced["expected_usd"] > 0
    assert srv.n_requests == 0

    assert main(base) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["calls"] == 12 and summary["errors"] == 0 and srv.n_requests == 12
    assert main([*base, "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["calls_to_send"] == 0

    pairs = tmp_path / "pairs.jsonl"
    assert main(["pairs", str(states), str(out / "teacher_calls.jsonl"), "--out", str(pairs)]) == 0
    rows = list(read_jsonl(pairs))
    assert len(rows) == 4 and all(r["n_teachers_agreeing"] == 2 and r["chosen"] == READ for r in rows)

    norm = tmp_path / "norm.jsonl"
    assert main(["normalize", str(pairs), "--out", str(norm), "--skip-dj"]) == 0
    assert [r["state_id"] for r in read_jsonl(norm)] == [r["state_id"] for r in rows]
    assert json.loads((tmp_path / "norm.report.json").read_text())["records_out"] == 4

    stop = tmp_path / "STOP"
    stop.write_text("")
    write_jsonl_atomic(states, make_states(2, prefix="n"))
    assert main([*base, "--stop-file", str(stop)]) == 3


def test_cli_bad_teacher_price(tmp_path, capsys):
    states = tmp_path / "states.jsonl"
    write_jsonl_atomic(states, make_states(1))
    code = main(
        ["replay", str(states), "--out", str(tmp_path), "--max-usd", "1", "--teachers", "x/y", "--dry-run"]
    )
    assert code == 1 and "x/y=IN:OUT" in capsys.readouterr().err


def test_teacher_config_file(tmp_path):
    import argparse

    from composer_replication.cli.replay import add_arguments, load_teachers

    cfg = tmp_path / "teachers.yaml"
    cfg.write_text(
        "teachers:\n  - {slug: local/q, input_per_mtok: 0, output_per_mtok: 0, base_url: 'http://127.0.0.1:9/v1'}\n"
        "  - {slug: openai/gpt-5, input_per_mtok: 1.25, output_per_mtok: 10, api_key_env: MY_KEY}\n"
    )
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["s.jsonl", "--out", "o", "--max-usd", "1", "--config", str(cfg)])
    teachers = load_teachers(args)
    assert [t["slug"] for t in teachers] == ["local/q", "openai/gpt-5"] and teachers[1][
        "api_key_env"
    ] == "MY_KEY"
    cfg.write_text("- {input_per_mtok: 1}\n")
    with pytest.raises(ValueError, match="list of teacher specs"):
        load_teachers(args)


def test_teacher_file_is_read_by_the_one_config_reader(tmp_path):
    from composer_replication.cli.replay import read_teacher_file
    from composer_replication.config import ConfigError

    toml = tmp_path / "teachers.toml"
    toml.write_text('[[teachers]]\nslug = "t/a"\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n')
    assert read_teacher_file(toml) == [{"slug": "t/a", "input_per_mtok": 1.0, "output_per_mtok": 2.0}]
    js = tmp_path / "teachers.json"
    js.write_text('[{"slug": "t/b", "input_per_mtok": 0, "output_per_mtok": 0}]')
    assert [t["slug"] for t in read_teacher_file(js)] == ["t/b"]

    bad = tmp_path / "bad.yaml"
    bad.write_text("teachers:\n  - {slug: t/a, input_per_mtok: 1, output_per_mtok: 1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML: .*line 3"):
        read_teacher_file(bad)
    bad.write_text("teachers:\n  - {slug: t/a, input_per_mtok: 1, output_per_mtok: 1, base_ulr: x}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: teachers\.0\.base_ulr: unknown key"):
        read_teacher_file(bad)
    bad.write_text("teacher:\n  - {slug: t/a}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: teacher: unknown key"):
        read_teacher_file(bad)
    ini = tmp_path / "teachers.ini"
    ini.write_text("x")
    with pytest.raises(ConfigError, match="unknown config format '.ini'"):
        read_teacher_file(ini)
