"""The EKS executor end to end against a loopback Kubernetes API (the real client, pointed at
`_kube_standin`): launch, per-replica state from the Job status and pods, a cancel that stops one
replica only, and collect ending on its own when pods or the whole Job are gone."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("kubernetes")

from composer_replication.diloco.serverless import DEFAULT_ENTRYPOINT, ReplicaFailedError  # noqa: E402
from composer_replication.diloco.serverless.eks import CANCEL_CONDITION, EKSExecutor, parse_indexes  # noqa: E402

from ._kube_standin import KubeStandIn  # noqa: E402

CFG = {"run_id": "k8s", "store": {"type": "s3", "bucket": "b"}, "rounds": 1}
DONE = '{"event": "start"}\n{"event": "done", "rank": %d, "param_sha256": "abc"}'


@pytest.fixture()
def kube():
    api = KubeStandIn()
    yield api
    api.close()


def _executor(kube, **kw):
    from kubernetes import client

    cfg = client.Configuration(host=kube.url)
    kw = {"poll_interval_s": 0.05, "pod_gone_grace_s": 0.3, **kw}
    return EKSExecutor(
        image="ghcr.io/x/cr:1", namespace="ml", job_name="run", api_client=client.ApiClient(cfg), **kw
    )


def test_launch_sends_an_indexed_job_with_a_cancel_rule(kube):
    ex = _executor(kube)
    handles = ex.launch_replicas(3, DEFAULT_ENTRYPOINT, CFG, timeout=600)
    assert [h.rank for h in handles] == [0, 1, 2]
    posts = [(path, body) for method, path, body, _ in kube.requests if method == "POST"]
    assert [p for p, _ in posts] == ["/api/v1/namespaces/ml/services", "/apis/batch/v1/namespaces/ml/jobs"]
    spec = posts[1][1]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 3
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "FailIndex", "onPodConditions": [{"type": CANCEL_CONDITION, "status": "True"}]}
    ]
    args = spec["template"]["spec"]["containers"][0]["args"]
    assert "--rank" not in args and json.loads(args[args.index("--config-json") + 1]) == CFG
    assert [ex.poll(h) for h in handles] == ["pending"] * 3


def test_cancel_stops_one_replica_and_collect_reports_each(kube):
    ex = _executor(kube)
    handles = ex.launch_replicas(3, DEFAULT_ENTRYPOINT, CFG)
    for i in range(3):
        kube.set_pod("run", i, "Running", log="step 1")
    assert [ex.poll(h) for h in handles] == ["running"] * 3
    target = kube.set_pod("run", 1, "Running")
    n_before = len(kube.requests)
    ex.cancel(handles[1])
    writes = [(m, p, b, ct) for m, p, b, ct in kube.requests[n_before:] if m != "GET"]
    assert [(m, p) for m, p, _, _ in writes] == [
        ("PATCH", f"/api/v1/namespaces/ml/pods/{target}/status"),
        ("DELETE", f"/api/v1/namespaces/ml/pods/{target}"),
    ]  # that pod only: the Job and the other pods are untouched
    patch, ctype = writes[0][2], writes[0][3]
    assert ctype == "application/strategic-merge-patch+json"
    assert patch["status"]["conditions"][0]["type"] == CANCEL_CONDITION
    assert "run" in kube.jobs and parse_indexes(kube.jobs["run"]["status"]["failedIndexes"]) == {1}
    assert ex.poll(handles[1]) == "cancelled"
    assert ex.poll(handles[0]) == "running" and ex.poll(handles[2]) == "running"

    kube.set_pod("run", 0, "Succeeded", exit_code=0, log=DONE % 0)
    gone = kube.set_pod("run", 2, "Running")
    kube.remove_pod(gone)  # rank 2's pod vanishes and nothing replaces it
    start = time.monotonic()
    results = ex.collect(handles, timeout=30)
    assert time.monotonic() - start < 10, "collect must end once the pod is gone, not wait for the timeout"
    assert [r.state for r in results] == ["succeeded", "cancelled", "failed"]
    assert (
        results[0].value == {"event": "done", "rank": 0, "param_sha256": "abc"} and results[0].error is None
    )
    assert "cancelled" in results[1].error
    assert f"pod {gone} of index 2 disappeared" in results[2].error
    with pytest.raises(ReplicaFailedError, match=r"replica 1 cancelled.*replica 2 failed") as info:
        ex.collect(handles, timeout=30, raise_on_failure=True)
    assert [r.rank for r in info.value.failed] == [1, 2] and len(info.value.results) == 3


def test_collect_ends_when_the_job_is_gone(kube):
    ex = _executor(kube)
    handles = ex.launch_replicas(2, DEFAULT_ENTRYPOINT, CFG)
    kube.set_pod("run", 0, "Running")
    kube.set_pod("run", 1, "Running")
    kube.delete_job_behind_the_clients_back("run")  # deleted by hand, or expired by its TTL
    results = ex.collect(handles, timeout=30)
    assert [r.state for r in results] == ["failed", "failed"]
    assert all("Job ml/run no longer exists" in r.error for r in results)


def test_failed_index_and_failed_job_carry_their_reasons(kube):
    ex = _executor(kube)
    handles = ex.launch_replicas(3, DEFAULT_ENTRYPOINT, CFG)
    kube.set_pod("run", 0, "Failed", exit_code=3)
    assert ex.poll(handles[0]) == "pending"  # a failed pod whose index has retries left is not the end
    kube.jobs["run"]["status"]["failedIndexes"] = "0"  # retries used up
    kube.set_pod("run", 1, "Succeeded", exit_code=0, log=DONE % 1)
    kube.set_pod("run", 2, "Running")
    kube.set_job_condition(
        "run", "Failed", "DeadlineExceeded", "Job was active longer than specified deadline"
    )
    results = ex.collect(handles, timeout=30)
    assert [r.state for r in results] == ["failed", "succeeded", "failed"]
    assert "exit code 3" in results[0].error
    assert "DeadlineExceeded" in results[2].error and "before index 2 completed" in results[2].error


def test_delete_job_removes_the_job_and_service(kube):
    ex = _executor(kube)
    ex.launch_replicas(1, DEFAULT_ENTRYPOINT, CFG)
    ex.delete_job()
    assert not kube.jobs and not kube.services and not kube.pods


def test_parse_indexes():
    assert parse_indexes("0,2-4,7") == {0, 2, 3, 4, 7} and parse_indexes(None) == set()
