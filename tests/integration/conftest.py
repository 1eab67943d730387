"""Servers shared by integration modules: one local SageMaker (process mode: lmforge's server as host
processes) for every module that deploys to it (tests/image runs its own in image mode), and one
tiny-model server for the modules that only read from one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmforge.testing.server import RemoteServer
from tests.local_sagemaker import boto3_clients, local_sagemaker


@pytest.fixture(scope="session")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment a user gets from ``eval "$(lmforge local up --print-env)"``."""
    with local_sagemaker(tmp_path_factory.mktemp("local-sagemaker")) as env:
        yield env


@pytest.fixture(scope="session")
def clients(local: dict[str, str]) -> dict[str, Any]:
    return boto3_clients(local, "sagemaker", "sagemaker-runtime", "s3")


@pytest.fixture(scope="session")
def tiny_server(tiny_model: Path) -> Iterator[RemoteServer]:
    """``lmforge serve`` on the tiny model with its own serving.properties, for every module that only
    reads from such a server (test_server, test_openai_client, test_bench_cli, test_lora: one
    pytest-xdist group, so one start). A test that stops or breaks a server starts its own."""
    with RemoteServer(tiny_model) as srv:
        yield srv
