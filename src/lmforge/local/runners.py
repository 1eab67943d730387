"""What an endpoint's instances run on the local SageMaker: the Model's image, or a stand-in.

Mode ``image`` (the default wherever podman or docker answers) runs the image the Model names, as
SageMaker would, once it can be had locally:

- an ECR name of the local account (``ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG``) is pulled
  from the local ECR's registry (:mod:`lmforge.local.ecr`);
- any other name must already be in the engine's image store, or be pullable from where it lives
  (a public registry, when this machine reaches one);
- otherwise the instance fails with a ``FailureReason`` that says why (AWS's LMI images live in AWS
  accounts whose registries the local SageMaker has no credentials for).

Mode ``process`` (asked for with ``lmforge local up --mode process``, or the fallback where no engine
is installed) runs lmforge's container entrypoint as a host process, and therefore stands in for
lmforge's own images only: a Model naming another image fails, rather than silently running a
different program than the one that would ship.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.container.engine import ContainerEngine, EngineError
from lmforge.container.refs import is_lmforge_image
from lmforge.local.containers import (
    Container,
    ImageContainer,
    ProcessContainer,
    container_env,
    memory_limit,
    sagemaker_env,
)

if TYPE_CHECKING:
    from lmforge.local.registry import LocalRegistry

log = logging.getLogger("lmforge.local")

MODES = ("auto", "image", "process")
BIND_TO_PORT_LABEL = "com.amazonaws.sagemaker.capabilities.accept-bind-to-port"
DEFAULT_PULL_TIMEOUT_S = 600.0


class ImageUnavailable(Exception):
    """The Model's image cannot run here; the message becomes the FailureReason."""


@dataclass(frozen=True)
class RunPlan:
    mode: str
    image_uri: str
    local_ref: str = ""
    host_network: bool = True


class InstanceRunner:
    """Turns a Model's container definition into a :class:`Container` in the chosen mode."""

    def __init__(
        self,
        mode: str,
        engine: ContainerEngine | None,
        *,
        state_dir: Path,
        account: str,
        registry: LocalRegistry | None = None,
        python: str = sys.executable,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode == "image" and engine is None:
            raise EngineError("mode image needs a container engine (podman or docker)")
        self.mode = ("image" if engine is not None else "process") if mode == "auto" else mode
        self.engine = engine if self.mode == "image" else None
        self.any_engine = engine
        """The engine, even in process mode (to stop containers an earlier run left behind)."""
        self.state_dir = state_dir
        self.account = account
        self.registry = registry
        self.python = python

    def describe(self) -> str:
        if self.engine is not None:
            return f"image (each instance runs its Model's image with {self.engine.kind})"
        return "process (lmforge's server as a host process, standing in for lmforge's images only)"

    # ----- images
    def plan(self, image_uri: str, timeout_s: float = DEFAULT_PULL_TIMEOUT_S) -> RunPlan:
        """How to run ``image_uri``; ImageUnavailable says why it cannot be."""
        if self.engine is None:
            if not is_lmforge_image(image_uri):
                raise ImageUnavailable(
                    f"The local SageMaker runs in process mode (lmforge's server as a host process), which "
                    f"stands in for lmforge's own images only, and the Model's image is {image_uri}. "
                    "Start it in image mode (lmforge local up --mode image, with podman or docker "
                    "installed) to run that image, or deploy one of lmforge's images."
                )
            return RunPlan("process", image_uri)
        ref = self._obtain(self.engine, image_uri, timeout_s)
        labels = self._labels(self.engine, ref)
        host_network = str(labels.get(BIND_TO_PORT_LABEL, "")).lower() == "true"
        if not host_network and not self.engine.publishes_ports():
            raise ImageUnavailable(
                f"{image_uri} has no {BIND_TO_PORT_LABEL}=true label, so it listens on port 8080 and "
                f"must run behind a published port, and this {self.engine.kind} daemon has no bridge "
                "network to publish one through (dockerd --bridge=none). Start dockerd with its default "
                "bridge, use podman, or deploy an image that accepts SAGEMAKER_BIND_TO_PORT (lmforge's "
                "images do)."
            )
        return RunPlan("image", image_uri, ref, host_network)

    def _obtain(self, engine: ContainerEngine, image_uri: str, timeout_s: float) -> str:
        from lmforge.local import ecr as ecr_api

        parsed = ecr_api.parse_ecr_uri(image_uri)
        if parsed is not None and parsed.account == self.account:
            if self.registry is None:
                raise ImageUnavailable(
                    f"CannotPullContainerError: {image_uri} is in the local ECR, whose registry is not "
                    "running (see lmforge local status)."
                )
            local = ecr_api.resolve(image_uri, self.account, self.registry)
            if local is None:
                raise ImageUnavailable(f"CannotPullContainerError: {image_uri} is not a local ECR image name")
            try:
                engine.pull(local, insecure=True, timeout=timeout_s)
            except EngineError as exc:
                why = _last_line(exc)
                missing = any(s in why.lower() for s in ("manifest unknown", "not found", "name unknown"))
                hint = (
                    " It is not there: push it first (lmforge container push FLAVOUR, or docker/podman push "
                    "to the proxyEndpoint of ecr get-authorization-token)."
                    if missing
                    else ""
                )
                raise ImageUnavailable(
                    f"CannotPullContainerError: {image_uri} could not be pulled from the local ECR: "
                    f"{why}.{hint}"
                ) from None
            return local
        if engine.image_exists(image_uri):
            return image_uri
        if parsed is not None:
            raise ImageUnavailable(
                f"CannotPullContainerError: {image_uri} is in the ECR registry of account "
                f"{parsed.account}, which the local SageMaker (account {self.account}) has no credentials "
                f"for, and it is not in the local image store ({engine.kind} images). AWS's LMI images live "
                "in such accounts. Deploy lmforge's image from the local ECR (lmforge container push "
                "FLAVOUR), pull or load the image into the local store yourself, or start the local "
                "SageMaker with `lmforge local up --mode process` to run lmforge's server as a host "
                "process instead."
            )
        try:
            engine.pull(image_uri, insecure=False, timeout=timeout_s)
        except EngineError as exc:
            raise ImageUnavailable(
                f"CannotPullContainerError: {image_uri} is not in the local image store ({engine.kind}) "
                f"and could not be pulled: {_last_line(exc)}. Build or load it first (lmforge container "
                "build FLAVOUR for lmforge's images)."
            ) from None
        return image_uri

    @staticmethod
    def _labels(engine: ContainerEngine, ref: str) -> Mapping[str, str]:
        data = engine.inspect_image(ref)
        config = data.get("Config") or data.get("ContainerConfig") or {}
        labels = config.get("Labels") or data.get("Labels") or {}
        return labels if isinstance(labels, dict) else {}

    # ----- instances
    def create(
        self,
        plan: RunPlan,
        *,
        label: str,
        folder: Path,
        port: int,
        model_env: Mapping[str, str],
        s3_url: str,
        base_env: Mapping[str, str],
        memory_gib: float | None,
    ) -> Container:
        if plan.mode == "process" or self.engine is None:
            env = container_env(base_env, model_env, port, s3_url)
            return ProcessContainer(label, folder, port, env, python=self.python, image=plan.image_uri)
        env = sagemaker_env(model_env, port if plan.host_network else None, s3_url)
        if not plan.host_network:
            # the container reaches no loopback service of this machine: S3 stays unreachable
            env.pop("AWS_ENDPOINT_URL", None)
        return ImageContainer(
            label,
            folder,
            port,
            env,
            engine=self.engine,
            image=plan.local_ref,
            image_uri=plan.image_uri,
            host_network=plan.host_network,
            memory_bytes=memory_limit(memory_gib),
            owner=str(self.state_dir),
        )


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else str(exc)
