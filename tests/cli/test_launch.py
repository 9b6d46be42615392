"""`composer-replication launch --dry-run` for every backend, config errors, and the status table."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from composer_replication.cli.main import main


@pytest.fixture()
def cfg_path(tmp_path):
    p = tmp_path / "diloco.yaml"
    p.write_text(yaml.safe_dump({"run_id": "dry", "store": {"type": "s3", "bucket": "b"}, "rounds": 2}))
    return p


def test_dry_run_eks_prints_an_indexed_job(cfg_path, capsys):
    rc = main(
        [
            "launch",
            "--backend",
            "eks",
            "--replicas",
            "3",
            "--gpu",
            "1",
            "-o",
            "image=ghcr.io/x/cr:1",
            "--dry-run",
            str(cfg_path),
        ]
    )
    assert rc == 0
    job, svc = yaml.safe_load_all(capsys.readouterr().out)
    assert (
        job["kind"] == "Job"
        and job["spec"]["completionMode"] == "Indexed"
        and job["spec"]["completions"] == 3
    )
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert json.loads(args[args.index("--config-json") + 1])["run_id"] == "dry"
    assert svc["kind"] == "Service"


def test_dry_run_sagemaker_prints_requests(cfg_path, capsys):
    rc = main([
        "launch", "--backend", "sagemaker", "--replicas", "2", "--dry-run", str(cfg_path),
        "-o", "role_arn=arn:aws:iam::1:role/r", "-o", "image_uri=img", "-o", "output_s3_uri=s3://b/o",
    ])  # fmt: skip
    assert rc == 0
    reqs = json.loads(capsys.readouterr().out)
    assert [r["Environment"]["REPLICA_RANK"] for r in reqs] == ["0", "1"]
    assert reqs[0]["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"


def test_dry_run_sagemaker_missing_option_is_a_clear_error(cfg_path, capsys):
    rc = main(["launch", "--backend", "sagemaker", "--dry-run", str(cfg_path)])
    assert rc == 1 and "-o KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["local", "modal", "hf-jobs"])
def test_dry_run_other_backends(backend, cfg_path, capsys, tmp_path):
    pytest.importorskip({"local": "json", "modal": "modal", "hf-jobs": "huggingface_hub"}[backend])
    extra = ["-o", "namespace=me"] if backend == "hf-jobs" else []
    rc = main(
        [
            "launch",
            "--backend",
            backend,
            "--replicas",
            "2",
            "--run-dir",
            str(tmp_path / "r"),
            *extra,
            "--dry-run",
            str(cfg_path),
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    text = json.dumps(out)
    assert "replica_entrypoint" in text or "run_replica" in text
    assert not (tmp_path / "r" / "replica-0.log").exists()  # nothing was started


def test_invalid_config_names_the_field(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"run_id": "x", "inner_stepz": 3}))
    assert main(["launch", "--dry-run", str(p)]) == 1
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "inner_stepz" in err
    assert main(["launch", "--dry-run", str(tmp_path / "missing.yaml")]) == 1


def test_status_table_renders_every_replica():
    from composer_replication.cli.launch import _progress, render_table

    step, last = _progress('loading\n{"event": "sync", "step": 12, "round": 2}\nstill going')
    assert (step, last) == ("12", "still going")
    table = render_table([(0, "running", step, last), (1, "failed", "-", "Traceback")])
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["rank", "state", "step"] and len(lines) == 4
    assert "failed" in lines[3]


def test_watch_redraws_until_done(tmp_path):
    from composer_replication.cli.launch import watch
    from composer_replication.diloco.serverless.executor import ReplicaHandle, ReplicaResult

    class Fake:
        def __init__(self):
            self.calls = 0

        def poll(self, h):
            self.calls += 1
            return "running" if self.calls <= 2 else "succeeded"

        def stream_logs(self, h, n_lines=200):
            return f'{{"step": {self.calls}}}'

        def collect(self, handles, timeout=None):
            return [ReplicaResult(h.rank, "succeeded") for h in handles]

    out = io.StringIO()
    res = watch(Fake(), [ReplicaHandle(0, "fake")], refresh=0.01, out=out)
    assert [r.state for r in res] == ["succeeded"] and out.getvalue().count("rank") >= 2


def test_config_without_a_store_is_rejected_before_launch(tmp_path, capsys):
    p = tmp_path / "nostore.yaml"
    p.write_text(yaml.safe_dump({"run_id": "x"}))
    assert main(["launch", "--dry-run", str(p)]) == 1
    assert "needs a `store` section" in capsys.readouterr().err
