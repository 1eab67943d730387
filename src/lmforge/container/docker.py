"""``docker buildx build`` and ``docker push`` for a flavour, with ECR login through boto3.

Everything goes through the ``docker`` command line; a missing client or a Docker engine that does
not answer is a :class:`DockerError` that says so and what to do instead.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Echo = Callable[[str], None]


class DockerError(Exception):
    pass


def _docker() -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise DockerError("the docker command is not installed; install Docker (with buildx) to build images")
    return docker


def check_engine() -> str:
    """The docker client's path once ``docker info`` shows a running engine; DockerError otherwise."""
    docker = _docker()
    proc = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        reason = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
        raise DockerError(
            f"no Docker engine is running ({reason}). Start Docker (or point DOCKER_HOST at one) and retry, "
            "or build on a machine that has one: the Dockerfile is containers/<flavour>/Dockerfile, "
            "the build context the repository root"
        )
    return docker


def build_command(docker: str, root: Path, flavour: str, tag: str, platform: str, push: bool) -> list[str]:
    return [
        docker,
        "buildx",
        "build",
        "--file",
        str(root / "containers" / flavour / "Dockerfile"),
        "--tag",
        tag,
        "--platform",
        platform,
        "--push" if push else "--load",
        str(root),
    ]


def run(cmd: Sequence[str], echo: Echo, stdin: str | None = None) -> None:
    echo("$ " + " ".join(cmd))
    proc = subprocess.run(list(cmd), input=stdin, text=True)
    if proc.returncode != 0:
        raise DockerError(f"{cmd[0]} {cmd[1]} failed with exit code {proc.returncode}")


def ecr_login(docker: str, registry: str, echo: Echo, ecr: Any = None) -> None:
    """``docker login`` to an ECR registry with a token from boto3 (``ecr:GetAuthorizationToken``)."""
    host = registry.split("/", 1)[0]
    if ".dkr.ecr." not in host:
        echo(f"{host} is not an ECR registry: using the credentials docker already has")
        return
    if ecr is None:
        import boto3

        region = host.split(".dkr.ecr.", 1)[1].split(".", 1)[0]
        ecr = boto3.client("ecr", region_name=region)
    data = ecr.get_authorization_token()["authorizationData"][0]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    run([docker, "login", "--username", user, "--password-stdin", host], echo, stdin=password)
