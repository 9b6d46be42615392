"""Bad input to the CLI gets a clear error naming the problem (no traceback) and nothing is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from composer_replication.cli.main import main
from composer_replication.teacher_replay.fake_server import FakeOpenRouter, sample_states

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def states(tmp_path):
    p = tmp_path / "states.jsonl"
    p.write_text("".join(json.dumps(s) + "\n" for s in sample_states(2)))
    return p


@pytest.fixture()
def srv():
    with FakeOpenRouter() as s:
        yield s


def _error(capsys, argv, code=1):
    """Run the real entry point; return its stderr after checking the exit code and the one-line form."""
    if code == 2:  # argparse usage errors
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    else:
        assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err


def _replay(states, out, *extra):
    return ["replay", str(states), "--out", str(out), "--max-usd", "1", "--no-progress", *extra]


def test_replay_out_is_a_file(tmp_path, states, srv, capsys):
    (tmp_path / "f").write_text("x")
    err = _error(capsys, _replay(states, tmp_path / "f", "--base-url", srv.base_url, "--teachers", "t/a=1:1"))
    assert len(err.splitlines()) == 1 and "is a file" in err and srv.n_requests == 0


def test_replay_states_path_is_a_directory(tmp_path, capsys):
    err = _error(capsys, _replay(tmp_path, tmp_path / "out", "--teachers", "t/a=1:1"))
    assert len(err.splitlines()) == 1 and "is a directory" in err


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_replay_timeout_must_be_positive(tmp_path, states, capsys, value):
    err = _error(capsys, _replay(states, tmp_path / "out", f"--timeout={value}"), code=2)
    assert "--timeout" in err


@pytest.mark.parametrize("flag", ["--max-usd=-1", "--concurrency=0", "--max-tokens=0"])
def test_replay_other_bounds(tmp_path, states, capsys, flag):
    argv = ["replay", str(states), "--out", str(tmp_path / "o"), flag] + (
        ["--max-usd", "1"] if "usd" not in flag else []
    )
    assert flag.split("=")[0] in _error(capsys, argv, code=2)


def test_replay_negative_teacher_price(tmp_path, states, srv, capsys):
    err = _error(
        capsys, _replay(states, tmp_path / "o", "--base-url", srv.base_url, "--teachers", "t/a=-1:2")
    )
    assert "prices must be finite numbers >= 0" in err and srv.n_requests == 0
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump([{"slug": "t/a", "input_per_mtok": 1.0, "output_per_mtok": -3.0,
                                    "base_url": srv.base_url}]))  # fmt: skip
    err = _error(capsys, _replay(states, tmp_path / "o", "--config", str(cfg)))
    assert "output_per_mtok is -3.0" in err and srv.n_requests == 0


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/v1", "127.0.0.1:8000/v1"])
def test_replay_base_url_must_be_http(tmp_path, states, capsys, url):
    err = _error(capsys, _replay(states, tmp_path / "o", "--base-url", url, "--teachers", "t/a=1:1"))
    assert "http:// or https://" in err and "--base-url" in err
    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        yaml.safe_dump([{"slug": "t/a", "input_per_mtok": 1.0, "output_per_mtok": 1.0, "base_url": url}])
    )
    err = _error(capsys, _replay(states, tmp_path / "o", "--config", str(cfg)))
    assert "http:// or https://" in err and "'t/a'" in err


def _run_config(tmp_path, **replay):
    cfg = tmp_path / "run.yaml"
    teacher = {
        "slug": "t/a",
        "input_per_mtok": 1.0,
        "output_per_mtok": 1.0,
        "base_url": "http://127.0.0.1:9/v1",
    }
    cfg.write_text(yaml.safe_dump({"sources": {"paths": ["s"]}, "replay": {"teachers": [teacher], "max_tokens": 64,
                                                                          **replay}}))  # fmt: skip
    return cfg


def test_run_out_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    err = _error(capsys, ["run", str(_run_config(tmp_path)), "--out", str(tmp_path / "f")])
    assert len(err.splitlines()) == 1 and "is a file" in err


def test_run_set_on_a_scalar(tmp_path, capsys):
    err = _error(
        capsys,
        ["run", str(_run_config(tmp_path)), "--out", str(tmp_path / "r"), "--set", "replay.max_tokens.x=1"],
    )
    assert len(err.splitlines()) == 1 and "replay.max_tokens is a value (64), not a section" in err
    err = _error(
        capsys, ["run", str(_run_config(tmp_path)), "--out", str(tmp_path / "r"), "--set", "seed.a.b=1"]
    )
    assert "seed" in err
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_run_config_rejects_bad_teachers(tmp_path, capsys):
    cfg = _run_config(tmp_path)
    data = yaml.safe_load(cfg.read_text())
    data["replay"]["teachers"][0].update(input_per_mtok=-2.0, base_url="file:///etc")
    cfg.write_text(yaml.safe_dump(data))
    err = _error(capsys, ["run", str(cfg), "--out", str(tmp_path / "r")])
    assert "replay.teachers.0.input_per_mtok" in err and "replay.teachers.0.base_url" in err


def test_run_config_path_is_a_directory(tmp_path, capsys):
    assert "is a directory" in _error(capsys, ["run", str(tmp_path), "--out", str(tmp_path / "r")])


@pytest.mark.parametrize(
    "flag",
    ["--max-history-tokens=-1", "--example-max-tokens=0", "--jobs=0", "--jobs=-3", "--jobs=100000",
     "--jobs=auto;rm", "--jobs=1e3", "--jobs=99999999999999999999999"],
)  # fmt: skip
def test_ingest_bounds(tmp_path, capsys, flag):
    err = _error(capsys, ["ingest", str(tmp_path), "--out", str(tmp_path / "o"), flag], code=2)
    assert flag.split("=")[0] in err


def test_validate_accepts_both_config_kinds(tmp_path, capsys):
    assert main(["validate", str(REPO / "examples" / "cpu.yaml")]) == 0
    assert "run config" in capsys.readouterr().out
    train = tmp_path / "train.yaml"
    (tmp_path / "traces.jsonl").write_text("")
    train.write_text(yaml.safe_dump({"mode": "offline", "data": {"traces": "traces.jsonl"}}))
    assert main(["validate", str(train)]) == 0
    assert "mode=offline" in capsys.readouterr().out
    bad = _run_config(tmp_path, max_tokens=0)
    err = _error(capsys, ["validate", str(bad)])
    assert "replay.max_tokens" in err


@pytest.mark.parametrize("value", ["1e400", ".inf", "-.inf", ".nan"])
def test_non_finite_numbers_in_a_config_are_refused_by_field(tmp_path, capsys, value):
    """YAML reads 1e400 as infinity: a dollar cap or a loss weight of inf (or NaN) is refused by name before
    anything runs, in a run config and in a train config."""
    from composer_replication.config import ConfigError, load_config

    cfg = _run_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("max_tokens: 64", f"max_tokens: 64\n  max_total_usd: {value}"))
    err = _error(capsys, ["run", str(cfg), "--out", str(tmp_path / "r")])
    assert "replay.max_total_usd" in err and "run.yaml" in err and not (tmp_path / "r").exists()
    (tmp_path / "pairs.jsonl").write_text("")
    train = tmp_path / "train.yaml"
    train.write_text(f"data: {{pairs: pairs.jsonl}}\nloss: {{preference: {{rpo_alpha: {value}}}}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(train)
    assert "loss.preference.rpo_alpha" in str(e.value) and "train.yaml" in str(e.value)


@pytest.mark.parametrize(
    "content, words",
    [
        (b"garbage\x00\xff not json\n", ":1: not valid JSON"),
        (b'{"a": 1}\n', "trace 1 has no `turns` list"),
        (b"", "no rows to train on"),
        (b"[1, 2]\n", ":1: expected a JSON object"),
    ],
)
@pytest.mark.parametrize("mode", ["offline", "grpo"])
def test_train_with_bad_traces_leaves_no_out_directory(tmp_path, capsys, content, words, mode):
    """`--traces` is checked before `--out` is created: a bad file leaves nothing behind."""
    bad = tmp_path / "traces.jsonl"
    bad.write_bytes(content)
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": "tiny"}, "data": {"traces": str(bad)},
                                   "schedule": {"max_steps": 1}, "logging": {"plot": False}}))  # fmt: skip
    out = tmp_path / "out"
    err = _error(capsys, ["train", str(cfg), "--traces", str(bad), "--out", str(out), "--mode", mode])
    assert len(err.splitlines()) == 1 and words in err and str(bad) in err
    assert not out.exists()
