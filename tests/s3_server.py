"""A real S3 API server on loopback for tests: moto's ThreadedMotoServer on a free port.

Test modules import it by path (tests/ is not a package):
    from s3_server import moto_endpoint, new_bucket      # tests/ is on the import path (pyproject.toml)
"""
from __future__ import annotations

import contextlib
import logging
import socket
import uuid

import boto3
from botocore.config import Config

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_endpoint():
    """Start moto's S3 server on 127.0.0.1:<free port>; yield its endpoint URL."""
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.WARNING)      # one log line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def client(endpoint_url: str, *, max_attempts: int = 3):
    config = Config(retries={"max_attempts": max_attempts, "mode": "standard"}, max_pool_connections=16)
    return boto3.client("s3", endpoint_url=endpoint_url, config=config, **CREDENTIALS)


def new_bucket(endpoint_url: str) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    client(endpoint_url).create_bucket(Bucket=name)
    return name
