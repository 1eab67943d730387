"""One local SageMaker (process mode: lmforge's server as host processes) for every integration test
module that deploys to it; tests/image runs its own in image mode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.local_sagemaker import boto3_clients, local_sagemaker


@pytest.fixture(scope="session")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment a user gets from ``eval "$(lmforge local up --print-env)"``."""
    with local_sagemaker(tmp_path_factory.mktemp("local-sagemaker")) as env:
        yield env


@pytest.fixture(scope="session")
def clients(local: dict[str, str]) -> dict[str, Any]:
    return boto3_clients(local, "sagemaker", "sagemaker-runtime", "s3")
