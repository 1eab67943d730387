"""ECR image URIs: :func:`parse_ecr_uri` splits one, :func:`resolve` maps one of the local account to
the name to pull from the local registry."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lmforge.local.registry import LocalRegistry

_NAME = r"(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*"
_ECR_URI = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)"
    r"\.(?P<domain>amazonaws\.com(?:\.cn)?)"
    rf"/(?P<repository>{_NAME})"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?"
)


@dataclass(frozen=True)
class EcrImage:
    """``ACCOUNT.dkr.ecr.REGION.amazonaws.com[.cn]/REPOSITORY[:TAG][@DIGEST]``, split."""

    account: str
    region: str
    repository: str
    tag: str | None
    """The tag; ``latest`` when the URI names neither a tag nor a digest."""
    digest: str | None
    domain: str = "amazonaws.com"

    @property
    def host(self) -> str:
        return f"{self.account}.dkr.ecr.{self.region}.{self.domain}"

    @property
    def reference(self) -> str:
        """What to ask a registry for: the digest when there is one (it wins over a tag), else the tag."""
        return self.digest or self.tag or "latest"


def parse_ecr_uri(uri: str) -> EcrImage | None:
    """Split an ECR image URI; None when ``uri`` is not one (another registry, a bare name, ...)."""
    match = _ECR_URI.fullmatch(uri.strip())
    if match is None:
        return None
    tag, digest = match["tag"], match["digest"]
    return EcrImage(
        account=match["account"],
        region=match["region"],
        repository=match["repository"],
        tag=tag if tag or digest else "latest",
        digest=digest,
        domain=match["domain"],
    )


def resolve(image_uri: str, account: str, registry: LocalRegistry) -> str | None:
    """``ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO[:TAG|@DIGEST]`` of ``account`` -> the name in
    ``registry`` (``127.0.0.1:PORT/REPO:TAG`` or ``...@DIGEST``); None for any other image.

    Every region maps to the same registry (see the limitations in :mod:`lmforge.local.ecr`).
    """
    image = parse_ecr_uri(image_uri)
    if image is None or image.account != account:
        return None
    if image.digest:
        return f"{registry.address}/{image.repository}@{image.digest}"
    return f"{registry.address}/{image.repository}:{image.tag}"
