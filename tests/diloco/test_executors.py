"""Cloud executors at their boundary, without the cloud: Modal `.local()`, SageMaker through boto3 against
moto, Kubernetes Job objects from the client's models, HF Jobs against a loopback HTTP endpoint."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from composer_replication.diloco.serverless import (
    DEFAULT_ENTRYPOINT,
    ReplicaFailedError,
    ReplicaHandle,
    ServerlessExecutor,
    get_executor,
)
from composer_replication.diloco.serverless.executor import Launch, state_map


def _cfg(tmp_path, rounds=1):
    return {
        "run_id": "exec",
        "store": {"type": "local", "root": str(tmp_path / "store")},
        "rounds": rounds,
        "inner_steps": 2,
        "model": {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1},
    }


def test_dispatch_and_protocol(tmp_path):
    ex = get_executor("local", run_dir=tmp_path)
    assert isinstance(ex, ServerlessExecutor) and ex.backend_name == "local_process"
    with pytest.raises(ValueError, match="choose from: local, modal, hf-jobs, sagemaker, eks"):
        get_executor("slurm")


def test_modal_function_runs_a_replica_locally(tmp_path):
    pytest.importorskip("modal")
    from composer_replication.diloco.serverless.modal import ModalExecutor

    ex = get_executor("modal", app_name="cr-test")
    assert isinstance(ex, ModalExecutor) and isinstance(ex, ServerlessExecutor)
    fn = ex.build_function(gpu="A10G", timeout=600)
    result = fn.local(DEFAULT_ENTRYPOINT, _cfg(tmp_path), 0, 1)
    assert result["rank"] == 0 and len(result["rounds"]) == 1
    assert result["rounds"][0]["participants"] == [0]
    assert ex.function_options(gpu="A10G")["gpu"] == "A10G"


def test_sagemaker_jobs_against_moto(moto_endpoint, tmp_path):
    from composer_replication.diloco.serverless.sagemaker import SageMakerExecutor

    ex = SageMakerExecutor(
        role_arn="arn:aws:iam::123456789012:role/sm",
        image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/cr:latest",
        output_s3_uri="s3://bucket/out",
        region="us-east-1",
        endpoint_url=moto_endpoint,
    )
    cfg = _cfg(tmp_path)
    handles = ex.launch_replicas(2, DEFAULT_ENTRYPOINT, cfg, timeout=900)
    assert [h.rank for h in handles] == [0, 1]
    for h in handles:
        d = ex.describe_job(h)
        spec = d["AlgorithmSpecification"]
        assert d["TrainingJobName"] == h.metadata["job_name"]
        assert d["StoppingCondition"]["MaxRuntimeInSeconds"] == 900
        assert ex.poll(h) in ("running", "succeeded")
    req = ex.requests(Launch(2, DEFAULT_ENTRYPOINT, cfg))[1]
    args = req["AlgorithmSpecification"]["ContainerArguments"]
    assert args[args.index("--rank") + 1] == "1" and json.loads(args[args.index("--config-json") + 1]) == cfg
    assert spec["TrainingImage"].endswith("cr:latest")
    assert ex.stream_logs(handles[0]) == ""  # no CloudWatch stream yet (moto runs no container)
    # moto 5 does not implement stop_training_job, so cancel() is exercised only in the cloud test


def test_eks_indexed_job_builds_and_validates(tmp_path):
    pytest.importorskip("kubernetes")
    from kubernetes.client import ApiClient, V1Job

    ex = get_executor("eks", image="ghcr.io/x/cr:1", namespace="ml", job_name="diloco-run", load_config=False)
    job, svc = ex.build(Launch(4, DEFAULT_ENTRYPOINT, _cfg(tmp_path), gpu="1", timeout=7200))
    assert isinstance(job, V1Job)
    job_d, svc_d = ex.manifests(Launch(4, DEFAULT_ENTRYPOINT, _cfg(tmp_path), gpu="1", timeout=7200))
    spec = job_d["spec"]
    assert job_d["apiVersion"] == "batch/v1" and job_d["kind"] == "Job"
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    assert spec["activeDeadlineSeconds"] == 7200
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == "diloco-run"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert svc_d["spec"]["clusterIP"] == "None" and svc_d["spec"]["selector"] == {"job-name": "diloco-run"}
    # round-trip through the client's own deserialiser: the dict is a valid V1Job
    back = ApiClient()._ApiClient__deserialize(job_d, "V1Job")
    assert back.spec.template.spec.containers[0].args == job.spec.template.spec.containers[0].args


class _HubHandler(BaseHTTPRequestHandler):
    requests: list = []
    stage = "RUNNING"

    def _send(self, body: dict | None, status=200, ctype="application/json"):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _job(self, job_id):
        return {
            "id": job_id,
            "owner": {"id": "1", "name": "me", "type": "user"},
            "status": {"stage": self.stage},
        }

    def do_POST(self):  # noqa: N802 - http.server naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.requests.append(
            ("POST", self.path, json.loads(body) if body else None, self.headers.get("authorization"))
        )
        if self.path.endswith("/cancel"):
            type(self).stage = "CANCELED"
            return self._send(None)
        return self._send(self._job(f"job{len(self.requests)}"))

    def do_GET(self):  # noqa: N802
        self.requests.append(("GET", self.path, None, None))
        if "/logs" in self.path:
            events = "".join(
                f"data: {json.dumps({'data': line, 'timestamp': '2026-01-01T00:00:00Z'})}\n\n"
                for line in ["===== Job started", "hello", '{"event": "done", "rank": 0}']
            )
            data = events.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        return self._send(self._job(self.path.rsplit("/", 1)[1].split("?")[0]))

    def log_message(self, *a):
        pass


@pytest.fixture()
def hub():
    _HubHandler.requests = []
    _HubHandler.stage = "RUNNING"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HubHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", _HubHandler
    server.shutdown()


def test_hf_jobs_against_loopback_hub(hub, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    endpoint, handler = hub
    from huggingface_hub import constants

    monkeypatch.setattr(
        constants, "HF_HUB_OFFLINE", False
    )  # conftest sets offline mode; this hub is loopback
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-SECRET-VALUE")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    ex = get_executor("hf-jobs", namespace="me", endpoint=endpoint, token="hf_test_token", run_name="t")
    cfg = _cfg(tmp_path)
    handles = ex.launch_replicas(2, DEFAULT_ENTRYPOINT, cfg, gpu="a10g-small", timeout=600)
    posts = [r for r in handler.requests if r[0] == "POST"]
    assert [p[1] for p in posts] == ["/api/jobs/me", "/api/jobs/me"]
    spec = posts[1][2]
    assert spec["flavor"] == "a10g-small" and spec["timeoutSeconds"] == 600
    cmd = " ".join(spec["command"])
    assert "--rank 1" in cmd and "--world-size 2" in cmd and "replica_entrypoint" in cmd
    assert spec["secrets"] == {"AWS_ACCESS_KEY_ID": "AKIA-SECRET-VALUE"}  # sent as a secret, not env
    assert "AKIA-SECRET-VALUE" not in json.dumps(spec["environment"])
    assert posts[0][3] == "Bearer hf_test_token"
    assert ex.poll(handles[0]) == "running"
    assert "hello" in ex.stream_logs(handles[0])
    ex.cancel(handles[0])
    assert ex.poll(handles[0]) == "cancelled"
    # dry-run specs name the secrets, never their values
    assert "AKIA-SECRET-VALUE" not in json.dumps(ex.job_specs(Launch(2, DEFAULT_ENTRYPOINT, cfg)))


def test_hf_jobs_collect_raises_on_an_errored_job(hub, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    endpoint, handler = hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    ex = get_executor("hf-jobs", namespace="me", endpoint=endpoint, token="hf_test_token")
    handles = ex.launch_replicas(2, DEFAULT_ENTRYPOINT, _cfg(tmp_path))
    handler.stage = "ERROR"
    assert [r.state for r in ex.collect(handles, timeout=10)] == ["failed", "failed"]
    with pytest.raises(
        ReplicaFailedError, match=r"2/2 replicas did not succeed; replica 0 failed.*replica 1 failed"
    ):
        ex.collect(handles, timeout=10, raise_on_failure=True)


def test_local_collect_raises_on_a_failed_replica(tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    cfg = {**_cfg(tmp_path), "store": {"type": "local", "root": str(tmp_path / "a-file" / "store")}}
    ex = get_executor("local", run_dir=tmp_path / "run")
    handles = ex.launch_replicas(1, DEFAULT_ENTRYPOINT, cfg)
    with pytest.raises(ReplicaFailedError, match="replica 0 failed") as info:
        ex.collect(handles, timeout=120, raise_on_failure=True)
    assert "NotADirectoryError" in info.value.failed[0].error  # the replica's own traceback
    assert [r.state for r in ex.collect(handles, timeout=5)] == ["failed"]  # without the flag: results


def test_replica_handle_is_plain_data():
    h = ReplicaHandle(rank=0, backend_name="local_process", metadata={"pid": 12345})
    assert h.metadata["pid"] == 12345 and ReplicaHandle(1, "x").metadata == {}


@pytest.mark.cloud
def test_modal_for_real(tmp_path):
    if not (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")):
        pytest.skip("no Modal credentials (MODAL_TOKEN_ID / MODAL_TOKEN_SECRET)")
    store_cfg = os.environ.get("CR_TEST_S3_BUCKET")
    if not store_cfg:
        pytest.skip("set CR_TEST_S3_BUCKET to an S3 bucket the Modal containers can reach")
    cfg = {**_cfg(tmp_path), "store": {"type": "s3", "bucket": store_cfg, "prefix": "cr-test"}}
    ex = get_executor("modal", secrets=["aws"])
    results = ex.collect(ex.launch_replicas(2, DEFAULT_ENTRYPOINT, cfg, timeout=900), timeout=1200)
    assert [r.state for r in results] == ["succeeded"] * 2
    assert results[0].value["param_sha256"] == results[1].value["param_sha256"]


@pytest.mark.parametrize(
    ("backend", "module", "kwargs"),
    [
        ("modal", "modal", {}),
        ("hf-jobs", "huggingface_hub", {}),
        ("eks", "kubernetes", {"image": "x"}),
    ],
)
def test_missing_sdk_names_the_extra(backend, module, kwargs, monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # makes `import <module>` raise ImportError
    with pytest.raises(ImportError, match=rf"composer-replication\[{backend}\]"):
        ex = get_executor(backend, **kwargs)
        # the EKS and Modal executors import their SDK when they build something
        (
            ex.build_function()
            if backend == "modal"
            else ex.build(Launch(1, DEFAULT_ENTRYPOINT, _cfg(tmp_path)))
        )


def test_import_composer_replication_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, composer_replication as cr; "
        "heavy = [m for m in ('torchft', 'modal', 'kubernetes', 'huggingface_hub', 'boto3') if m in sys.modules]; "
        "assert not heavy, heavy; "
        "assert cr.make_diloco_outer_loop is not None; "
        "from composer_replication.diloco import DiLoCo, Manager, _DummyWork, _TORCHFT_AVAILABLE; "
        "assert _TORCHFT_AVAILABLE and DiLoCo.__module__ == 'torchft.local_sgd' and 'torchft' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.cloud
def test_sagemaker_for_real(tmp_path):
    need = ("CR_TEST_SAGEMAKER_ROLE_ARN", "CR_TEST_SAGEMAKER_IMAGE", "CR_TEST_S3_BUCKET")
    if not all(os.environ.get(k) for k in need):
        pytest.skip(f"set {', '.join(need)} (and AWS credentials) to run against SageMaker")
    from composer_replication.diloco.serverless.sagemaker import SageMakerExecutor

    bucket = os.environ["CR_TEST_S3_BUCKET"]
    ex = SageMakerExecutor(
        role_arn=os.environ["CR_TEST_SAGEMAKER_ROLE_ARN"],
        image_uri=os.environ["CR_TEST_SAGEMAKER_IMAGE"],
        output_s3_uri=f"s3://{bucket}/sagemaker-out",
        instance_type="ml.m5.large",
    )
    cfg = {**_cfg(tmp_path), "store": {"type": "s3", "bucket": bucket, "prefix": "cr-test-sm"}}
    results = ex.collect(ex.launch_replicas(2, DEFAULT_ENTRYPOINT, cfg, timeout=1800), timeout=3600)
    assert [r.state for r in results] == ["succeeded"] * 2


@pytest.mark.cloud
def test_hf_jobs_for_real(tmp_path):
    if not (os.environ.get("HF_TOKEN") and os.environ.get("CR_TEST_S3_BUCKET")):
        pytest.skip("set HF_TOKEN and CR_TEST_S3_BUCKET (and AWS credentials) to run on HF Jobs")
    cfg = {
        **_cfg(tmp_path),
        "store": {"type": "s3", "bucket": os.environ["CR_TEST_S3_BUCKET"], "prefix": "cr-test-hf"},
    }
    ex = get_executor("hf-jobs")
    results = ex.collect(ex.launch_replicas(2, DEFAULT_ENTRYPOINT, cfg, timeout=1800), timeout=3600)
    assert [r.state for r in results] == ["succeeded"] * 2


@pytest.mark.cloud
def test_eks_for_real(tmp_path):
    if not all(os.environ.get(k) for k in ("KUBECONFIG", "CR_TEST_K8S_IMAGE", "CR_TEST_S3_BUCKET")):
        pytest.skip(
            "set KUBECONFIG, CR_TEST_K8S_IMAGE and CR_TEST_S3_BUCKET to run an Indexed Job on a cluster"
        )
    ex = get_executor("eks", image=os.environ["CR_TEST_K8S_IMAGE"], job_name="cr-test-diloco")
    handles = ex.launch_replicas(
        2,
        DEFAULT_ENTRYPOINT,
        _cfg(tmp_path)
        | {"store": {"type": "s3", "bucket": os.environ["CR_TEST_S3_BUCKET"], "prefix": "cr-test-eks"}},
    )
    try:
        results = ex.collect(handles, timeout=1800)
    finally:
        ex.delete_job()
    assert [r.state for r in results] == ["succeeded"] * 2


def test_state_map_reads_a_provider_vocabulary_per_normalised_state():
    """Each backend's table (hf_jobs, sagemaker, eks) is written per replica state; a keyword that is not
    one of the normalised states is an error naming it, not a silently dead row."""
    from composer_replication.diloco.serverless import eks, hf_jobs, sagemaker

    assert state_map(running="RUNNING", cancelled=("CANCELED", "DELETED")) == {
        "RUNNING": "running", "CANCELED": "cancelled", "DELETED": "cancelled",
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"\['runing'\] are not replica states"):
        state_map(runing="RUNNING")
    assert hf_jobs._STAGES["DELETED"] == "cancelled" and sagemaker._STATUS["Stopping"] == "running"
    assert eks._PHASE["Failed"] == "pending"  # its Job retries the pod
