"""SageMaker executor: one training job per replica, through plain boto3 (extra ``sagemaker``).

What is covered: ``create_training_job`` per replica with the replica command as
``ContainerEntrypoint``/``ContainerArguments`` (any image with this package installed), polling
(``describe_training_job``), logs from CloudWatch (``/aws/sagemaker/TrainingJobs``), cancellation
(``stop_training_job``). boto3 rather than the SageMaker Python SDK v3: its ``ModelTrainer`` calls
AWS (IAM) when constructed and pulls ~130 packages; the request it would send is the same API call.

What is not covered: separate jobs are isolated unless placed in your VPC, so replicas sync through
the object store; instances bill until the job ends or ``MaxRuntimeInSeconds`` passes; the IAM role,
image and bucket are yours to provide.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from composer_replication._extras import require
from composer_replication.diloco.serverless.executor import (
    ExecutorBase,
    Launch,
    ReplicaHandle,
    ReplicaResult,
    finish,
    last_json,
    state_map,
    wait_for_states,
)

__all__ = ["SageMakerExecutor"]

_STATUS = state_map(
    running=("InProgress", "Stopping"), succeeded="Completed", failed="Failed", cancelled="Stopped"
)
LOG_GROUP = "/aws/sagemaker/TrainingJobs"


class SageMakerExecutor(ExecutorBase):
    """Replicas as SageMaker training jobs."""

    backend_name = "sagemaker"
    supports_inter_replica_network = False

    def __init__(
        self,
        *,
        role_arn: str,
        image_uri: str,
        output_s3_uri: str,
        instance_type: str = "ml.g5.xlarge",
        volume_size_gb: int = 50,
        job_prefix: str = "diloco",
        region: str | None = None,
        endpoint_url: str | None = None,
        client: Any = None,
        logs_client: Any = None,
    ) -> None:
        if not re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,40}", job_prefix):
            raise ValueError(f"job_prefix {job_prefix!r}: letters, digits and '-', at most 41 characters")
        self.role_arn, self.image_uri, self.output_s3_uri = role_arn, image_uri, output_s3_uri
        self.instance_type, self.volume_size_gb, self.job_prefix = instance_type, volume_size_gb, job_prefix
        if client is None or logs_client is None:
            require("sagemaker", purpose="the sagemaker backend")
            import boto3

            client = client or boto3.client("sagemaker", region_name=region, endpoint_url=endpoint_url)
            logs_client = logs_client or boto3.client("logs", region_name=region, endpoint_url=endpoint_url)
        self.client, self.logs = client, logs_client

    def requests(self, launch: Launch) -> list[dict[str, Any]]:
        """The ``create_training_job`` requests (what ``--dry-run`` prints). ``gpu`` is an instance type."""
        stamp, n_replicas = time.strftime("%Y%m%d-%H%M%S"), launch.n_replicas
        out = []
        for rank in range(n_replicas):
            cmd = launch.command(rank=rank)
            out.append(
                {
                    "TrainingJobName": f"{self.job_prefix}-{stamp}-r{rank}"[:63],
                    "AlgorithmSpecification": {
                        "TrainingImage": self.image_uri,
                        "TrainingInputMode": "File",
                        "ContainerEntrypoint": cmd[:3],
                        "ContainerArguments": cmd[3:],
                    },
                    "RoleArn": self.role_arn,
                    "OutputDataConfig": {"S3OutputPath": self.output_s3_uri},
                    "ResourceConfig": {
                        "InstanceType": launch.gpu or self.instance_type,
                        "InstanceCount": 1,
                        "VolumeSizeInGB": self.volume_size_gb,
                    },
                    "StoppingCondition": {"MaxRuntimeInSeconds": int(launch.timeout)},
                    "Environment": {"REPLICA_RANK": str(rank), "WORLD_SIZE": str(n_replicas)},
                    "Tags": [{"Key": "composer-replication", "Value": self.job_prefix}],
                }
            )
        return out

    def _describe(self, launch: Launch) -> str:
        """The ``create_training_job`` request of every replica, as JSON."""
        return json.dumps(self.requests(launch), indent=2)

    def _launch(self, launch: Launch) -> list[ReplicaHandle]:
        metadata = []
        for req in self.requests(launch):
            resp = self.client.create_training_job(**req)
            metadata.append({"job_name": req["TrainingJobName"], "arn": resp["TrainingJobArn"]})
        return self._handles(metadata)

    def describe_job(self, handle: ReplicaHandle) -> dict[str, Any]:
        """SageMaker's ``describe_training_job`` of one replica."""
        return self.client.describe_training_job(TrainingJobName=handle.metadata["job_name"])

    def poll(self, handle: ReplicaHandle) -> str:
        return _STATUS.get(self.describe_job(handle)["TrainingJobStatus"], "unknown")

    def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str:
        job = handle.metadata["job_name"]
        try:
            streams = self.logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job}/")
        except self.logs.exceptions.ResourceNotFoundException:
            return ""
        lines: list[str] = []
        for s in streams.get("logStreams", []):
            events = self.logs.get_log_events(
                logGroupName=LOG_GROUP, logStreamName=s["logStreamName"], limit=n_lines, startFromHead=False
            )
            lines.extend(e["message"] for e in events.get("events", []))
        return "\n".join(lines[-n_lines:])

    def cancel(self, handle: ReplicaHandle) -> None:
        self.client.stop_training_job(TrainingJobName=handle.metadata["job_name"])

    def collect(
        self, handles: list[ReplicaHandle], *, timeout: int | None = None, raise_on_failure: bool = False
    ) -> list[ReplicaResult]:
        desc: dict[int, dict[str, Any]] = {}

        def poll_all() -> dict[int, str]:
            desc.update({h.rank: self.describe_job(h) for h in handles})
            return {r: _STATUS.get(d["TrainingJobStatus"], "unknown") for r, d in desc.items()}

        states = wait_for_states(poll_all, timeout=timeout, interval=10, what="SageMaker jobs")
        out = [
            ReplicaResult(
                rank=h.rank,
                state=states[h.rank],
                value=last_json(self.stream_logs(h, n_lines=20)),
                error=desc[h.rank].get("FailureReason")
                or (None if states[h.rank] == "succeeded" else states[h.rank]),
            )
            for h in handles
        ]
        return finish(out, raise_on_failure=raise_on_failure)
