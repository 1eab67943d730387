"""Push an image to ECR the way AWS documents it, so that the same code pushes to a real account and
to the local ECR of ``lmforge local up``.

1. the repository (``lmforge-<flavour>``) is created when ``DescribeRepositories`` does not find it;
2. ``GetAuthorizationToken`` gives a user (``AWS``), a password and the ``proxyEndpoint`` to log in
   to: ``https://ACCOUNT.dkr.ecr.REGION.amazonaws.com`` on AWS, the local registry's
   ``http://127.0.0.1:PORT`` on the local ECR;
3. the engine logs in there (password on stdin), tags the local image for that host and pushes;
4. ``DescribeImages`` must then list the tag: the push is checked, not assumed.

The image's name stays the ECR name (``ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG``): that is
what a SageMaker Model names, and what the local SageMaker resolves to its registry.
"""

from __future__ import annotations

import base64
import urllib.parse
from dataclasses import dataclass
from typing import Any

from lmforge.container.engine import ContainerEngine, Echo, EngineError


class PushError(EngineError):
    pass


@dataclass(frozen=True)
class EcrRepository:
    host: str
    """``ACCOUNT.dkr.ecr.REGION.amazonaws.com``."""
    name: str
    """The repository name, e.g. ``lmforge-cpu`` or ``team/lmforge-cpu``."""

    @property
    def uri(self) -> str:
        return f"{self.host}/{self.name}"

    @property
    def account(self) -> str:
        return self.host.split(".", 1)[0]

    @property
    def region(self) -> str:
        return self.host.split(".dkr.ecr.", 1)[1].split(".", 1)[0]


def ecr_host(account: str, region: str) -> str:
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{account}.dkr.ecr.{region}.{domain}"


def parse_repository(uri: str) -> EcrRepository | None:
    """``HOST/NAME`` of an ECR repository (no tag), or None when ``uri`` names no ECR registry."""
    host, _, name = uri.strip().rstrip("/").partition("/")
    if ".dkr.ecr." not in host or not host.split(".", 1)[0].isdigit() or not name:
        return None
    return EcrRepository(host, name)


def ensure_repository(ecr: Any, repo: EcrRepository, echo: Echo) -> None:
    try:
        ecr.describe_repositories(registryId=repo.account, repositoryNames=[repo.name])
        return
    except ecr.exceptions.RepositoryNotFoundException:
        pass
    ecr.create_repository(repositoryName=repo.name, registryId=repo.account)
    echo(f"created ECR repository {repo.name}")


def login(engine: ContainerEngine, ecr: Any, repo: EcrRepository, echo: Echo) -> tuple[str, bool]:
    """Log the engine in to the registry that ECR names; returns (that host, plain HTTP?)."""
    data = ecr.get_authorization_token(registryIds=[repo.account])["authorizationData"][0]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    endpoint = str(data.get("proxyEndpoint") or f"https://{repo.host}")
    parsed = urllib.parse.urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
    insecure = parsed.scheme == "http"
    engine.login(parsed.netloc, user, password, insecure=insecure, echo=echo)
    return parsed.netloc, insecure


def image_in_ecr(ecr: Any, repo: EcrRepository, tag: str) -> bool:
    """Whether ``repo:tag`` is in ECR (False for a missing repository or tag)."""
    try:
        found = ecr.describe_images(
            registryId=repo.account, repositoryName=repo.name, imageIds=[{"imageTag": tag}]
        )
    except (ecr.exceptions.RepositoryNotFoundException, ecr.exceptions.ImageNotFoundException):
        return False
    return bool(found.get("imageDetails"))


def push_to_ecr(
    engine: ContainerEngine, ecr: Any, local_ref: str, repo: EcrRepository, tag: str, echo: Echo
) -> str:
    """Push ``local_ref`` as ``repo:tag``; returns the image's ECR URI."""
    if not engine.image_exists(local_ref):
        raise PushError(f"there is no local image {local_ref}: build it first (lmforge container build)")
    ensure_repository(ecr, repo, echo)
    host, insecure = login(engine, ecr, repo, echo)
    target = f"{host}/{repo.name}:{tag}"
    engine.tag(local_ref, target, echo)
    try:
        engine.push(target, insecure=insecure, echo=echo)
    finally:
        if host != repo.host:  # the local registry's address is only a push alias: drop the name
            engine.untag(target)
    if not image_in_ecr(ecr, repo, tag):
        raise PushError(f"the push finished but ECR does not list {repo.name}:{tag}")
    return f"{repo.uri}:{tag}"
