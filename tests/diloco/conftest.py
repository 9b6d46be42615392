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
    from composer_replication.diloco.serverless.store import S3Store

    import uuid

    bucket = f"t-{uuid.uuid4().hex[:20]}"
    return S3Store(bucket, prefix="exchange", endpoint_url=moto_endpoint, region="us-east-1", create_bucket=True)
