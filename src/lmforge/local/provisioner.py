"""Start and stop an endpoint's containers the way SageMaker does, without Docker.

For every production variant of an endpoint's configuration the provisioner downloads the model's
data from the (local) S3 within ``ModelDataDownloadTimeoutInSeconds``, extracts it safely into a
fresh ``model`` folder (what SageMaker mounts at ``/opt/ml/model``), starts ``lmforge serve`` on it
with the model's ``Environment`` and ``SAGEMAKER_BIND_TO_PORT``, and polls ``GET /ping`` (2 s per
try) until ``ContainerStartupHealthCheckTimeoutInSeconds``. The endpoint then goes ``InService``, or
``Failed`` with a ``FailureReason`` that quotes the container's log. One process stands for a
variant whatever its instance count. Stopping is SageMaker's: SIGTERM, then SIGKILL 30 s later.
"""

from __future__ import annotations

import http.client
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from lmforge.local import moto_ext

log = logging.getLogger("lmforge.local")

DEFAULT_HEALTH_CHECK_TIMEOUT_S = 240  # SageMaker's default: pass /ping within 4 minutes
DEFAULT_DOWNLOAD_TIMEOUT_S = 3600
PING_TIMEOUT_S = 2.0
STOP_GRACE_S = 30.0
FAILURE_REASON_MAX = 1024


class ProvisionError(Exception):
    """A container that could not be started; the message becomes the endpoint's FailureReason."""


@dataclass
class Container:
    variant: str
    port: int
    process: subprocess.Popen[bytes]
    folder: Path
    log_path: Path

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder / "model", ignore_errors=True)


@dataclass
class Deployment:
    """The running containers behind one endpoint configuration."""

    account: str
    region: str
    endpoint_name: str
    endpoint_arn: str
    config_name: str
    containers: dict[str, Container]
    weights: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    """Where the runtime sends one invocation."""

    account: str
    region: str
    endpoint_name: str
    endpoint_arn: str
    variant: str
    port: int


class RouteError(Exception):
    """An invocation that cannot be routed; the runtime answers it as a ValidationError."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ProvisionError(f"model data {uri!r} is not an s3:// URI")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ProvisionError(f"model data {uri!r} names no bucket")
    return bucket, key


def _ping(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PING_TIMEOUT_S)
    try:
        conn.request("GET", "/ping")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


class Provisioner:
    """Implements :class:`lmforge.local.moto_ext.EndpointHooks`; also answers the runtime's lookups."""

    def __init__(
        self,
        state_dir: Path,
        s3_endpoint_url: str,
        *,
        python: str = sys.executable,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.s3_endpoint_url = s3_endpoint_url
        self.python = python
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._lock = threading.Lock()
        self._deployments: dict[tuple[str, str, str], Deployment] = {}
        self._components: dict[tuple[str, str, str], tuple[str, str, Container]] = {}
        self._generation = 0
        self._stopping = False

    # ----- hooks called by the control plane (inside a moto request; must not block)
    def endpoint_created(self, backend: Any, endpoint: Any) -> None:
        self._spawn(backend, endpoint, endpoint.endpoint_config_name, update=False)

    def endpoint_updating(self, backend: Any, endpoint: Any, endpoint_config_name: str) -> None:
        self._spawn(backend, endpoint, endpoint_config_name, update=True)

    def endpoint_deleted(self, backend: Any, endpoint_name: str) -> None:
        from lmforge.local.inference_components import components

        key = (backend.account_id, backend.region_name, endpoint_name)
        with self._lock:
            deployment = self._deployments.pop(key, None)
        if deployment is not None:
            self._stop_later(list(deployment.containers.values()))
        store = components(backend)
        for component in [c for c in store.values() if c.endpoint_name == endpoint_name]:
            del store[component.name]
            self.component_deleted(backend, component)

    def component_created(self, backend: Any, component: Any) -> None:
        """A new inference component, or a new specification for one: start its container."""
        threading.Thread(
            target=self._provision_component,
            args=(backend, component),
            name=f"provision-{component.name}",
            daemon=True,
        ).start()

    def component_deleted(self, backend: Any, component: Any) -> None:
        with self._lock:
            placed = self._components.pop((backend.account_id, backend.region_name, component.name), None)
        if placed is not None:
            self._stop_later([placed[2]])

    def _provision_component(self, backend: Any, component: Any) -> None:
        from lmforge.local.inference_components import components

        with component.lock:
            component.generation += 1
            generation = component.generation
        updating = component.status == "Updating"
        spec = component.specification
        startup = spec.get("StartupParameters") or {}
        variant = {"VariantName": component.name, **startup}
        try:
            if spec.get("BaseInferenceComponentName"):
                raise ProvisionError(
                    "adapter inference components (BaseInferenceComponentName) are not emulated by the "
                    "local SageMaker yet"
                )
            container_spec: dict[str, Any] = {}
            if spec.get("ModelName"):
                container_spec = self._model_container(backend, spec["ModelName"])
            extra = spec.get("Container") or {}
            if extra.get("ArtifactUrl"):
                container_spec["ModelDataUrl"] = extra["ArtifactUrl"]
                container_spec.pop("ModelDataSource", None)
            env = {**(container_spec.get("Environment") or {}), **(extra.get("Environment") or {})}
            container_spec["Environment"] = env
            container = self._start_container(component.endpoint_name, variant, container_spec)
        except Exception as exc:
            reason = str(exc) if isinstance(exc, ProvisionError) else f"{type(exc).__name__}: {exc}"
            if component.generation == generation:
                component.failure_reason = reason[:FAILURE_REASON_MAX]
                component.status = "InService" if updating else "Failed"
            return
        registered = components(backend).get(component.name)
        current = registered is not None and registered is component and registered.generation == generation
        if self._stopping or not current:
            self._stop_later([container])
            return
        key = (backend.account_id, backend.region_name, component.name)
        with self._lock:
            old = self._components.get(key)
            self._components[key] = (component.endpoint_name, component.variant_name, container)
        component.failure_reason = None
        component.current_copies = component.copy_count
        component.status = "InService"
        if old is not None:
            self._stop_later([old[2]])

    # ----- runtime side
    def route(
        self,
        region: str | None,
        endpoint_name: str,
        target_variant: str | None = None,
        component: str | None = None,
    ) -> Route:
        """The container for an invocation, or RouteError saying why there is none."""
        with self._lock:
            found = [
                d
                for (_, reg, name), d in self._deployments.items()
                if name == endpoint_name and (region is None or reg == region)
            ]
            placed = [
                (account, reg, ep, variant, c)
                for (account, reg, name), (ep, variant, c) in self._components.items()
                if name == component and (region is None or reg == region)
            ]
        if not found:
            if self._known(region, endpoint_name):
                raise RouteError(f"Endpoint {endpoint_name} is not in service yet; wait for InService.")
            raise RouteError(f"Endpoint {endpoint_name} of account 123456789012 not found.")
        deployment = found[0]
        if component is not None:
            if not placed or placed[0][2] != endpoint_name:
                raise RouteError(
                    f"Inference component {component} is not in service on endpoint {endpoint_name}."
                )
            account, reg, _, variant, container = placed[0]
            return Route(account, reg, endpoint_name, deployment.endpoint_arn, variant, container.port)
        if not deployment.containers:
            raise RouteError(
                "Inference Component Name header is required for endpoints to which you plan to deploy "
                "inference components. Please include Inference Component Name header or consider using "
                "SageMaker models."
            )
        live = {v: c for v, c in deployment.containers.items() if c.alive}
        if target_variant is not None:
            if target_variant not in deployment.containers:
                raise RouteError(f"Endpoint {endpoint_name} has no production variant {target_variant!r}.")
            variant = target_variant
        elif not live:
            variant = sorted(deployment.containers)[0]  # the runtime reports the dead container
        else:
            names = sorted(live)
            weights = [deployment.weights.get(n, 1.0) for n in names]
            variant = random.choices(names, weights=weights if sum(weights) > 0 else None)[0]
        container = deployment.containers[variant]
        return Route(
            deployment.account,
            deployment.region,
            endpoint_name,
            deployment.endpoint_arn,
            variant,
            container.port,
        )

    def _known(self, region: str | None, endpoint_name: str) -> bool:
        from moto.sagemaker.models import sagemaker_backends

        for account in list(sagemaker_backends):
            for reg in list(sagemaker_backends[account]):
                if region is not None and reg != region:
                    continue
                if endpoint_name in sagemaker_backends[account][reg].endpoints:
                    return True
        return False

    def shutdown(self) -> None:
        self._stopping = True
        with self._lock:
            containers = [c for d in self._deployments.values() for c in d.containers.values()]
            containers += [c for _, _, c in self._components.values()]
            self._deployments.clear()
            self._components.clear()
        threads = [threading.Thread(target=c.stop) for c in containers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # ----- provisioning
    def _spawn(self, backend: Any, endpoint: Any, config_name: str, *, update: bool) -> None:
        threading.Thread(
            target=self._provision,
            args=(backend, endpoint, config_name, update),
            name=f"provision-{endpoint.endpoint_name}",
            daemon=True,
        ).start()

    def _stop_later(self, containers: list[Container]) -> None:
        for container in containers:
            threading.Thread(target=container.stop, daemon=True).start()

    def _provision(self, backend: Any, endpoint: Any, config_name: str, update: bool) -> None:
        name = endpoint.endpoint_name
        key = (backend.account_id, backend.region_name, name)
        started: dict[str, Container] = {}
        try:
            config = backend.describe_endpoint_config(config_name)
            variants = config["ProductionVariants"]
            threads: list[threading.Thread] = []
            errors: list[str] = []
            for variant in variants:
                if not variant.get("ModelName"):
                    continue  # a variant for inference components: they bring their own containers
                t = threading.Thread(
                    target=self._start_variant, args=(backend, name, variant, started, errors)
                )
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
            if errors:
                raise ProvisionError(" ".join(errors))
        except Exception as exc:  # every failure becomes the endpoint's FailureReason
            reason = str(exc) if isinstance(exc, ProvisionError) else f"{type(exc).__name__}: {exc}"
            log.warning("endpoint %s failed: %s", name, reason)
            self._stop_later(list(started.values()))
            if backend.endpoints.get(name) is endpoint:
                endpoint.failure_reason = reason[:FAILURE_REASON_MAX]
                endpoint.endpoint_status = "InService" if update else "Failed"
            return
        if self._stopping or backend.endpoints.get(name) is not endpoint:  # deleted meanwhile
            self._stop_later(list(started.values()))
            return
        deployment = Deployment(
            account=backend.account_id,
            region=backend.region_name,
            endpoint_name=name,
            endpoint_arn=endpoint.arn,
            config_name=config_name,
            containers=started,
            weights={v["VariantName"]: float(v.get("InitialVariantWeight", 1.0)) for v in variants},
        )
        with self._lock:
            old = self._deployments.get(key)
            self._deployments[key] = deployment
        if update:
            moto_ext.finish_update(endpoint, backend, config_name)
        endpoint.failure_reason = None
        endpoint.endpoint_status = "InService"
        log.info(
            "endpoint %s is InService (%s)", name, ", ".join(f"{v}:{c.port}" for v, c in started.items())
        )
        if old is not None:
            self._stop_later(list(old.containers.values()))

    def _start_variant(
        self,
        backend: Any,
        endpoint_name: str,
        variant: dict[str, Any],
        started: dict[str, Container],
        errors: list[str],
    ) -> None:
        variant_name = variant["VariantName"]
        try:
            spec = self._model_container(backend, variant["ModelName"])
            started[variant_name] = self._start_container(endpoint_name, variant, spec)
        except ProvisionError as exc:
            errors.append(str(exc))
        except Exception as exc:
            errors.append(f"production variant {variant_name}: {type(exc).__name__}: {exc}")

    @staticmethod
    def _model_container(backend: Any, model_name: str) -> dict[str, Any]:
        model = backend.describe_model(model_name)
        spec = model.primary_container or (model.containers[0] if model.containers else None)
        if not spec:
            raise ProvisionError(f"model {model_name} has no container definition")
        return dict(spec)

    def _start_container(
        self, endpoint_name: str, variant: dict[str, Any], spec: Mapping[str, Any]
    ) -> Container:
        """Fetch the model data, start ``lmforge serve`` and wait for ``/ping``; ProvisionError otherwise."""
        variant_name = variant["VariantName"]
        with self._lock:
            self._generation += 1
            generation = self._generation
        folder = self.state_dir / "endpoints" / endpoint_name / f"{variant_name}-{generation}"
        folder.mkdir(parents=True, exist_ok=True)
        model_dir = folder / "model"
        download_timeout = int(variant.get("ModelDataDownloadTimeoutInSeconds") or DEFAULT_DOWNLOAD_TIMEOUT_S)
        started_at = time.monotonic()
        self._fetch_model_data(spec, model_dir, deadline=started_at + download_timeout)
        port = _free_port()
        env = dict(self.base_env)
        env.update({str(k): str(v) for k, v in (spec.get("Environment") or {}).items()})
        env.update({"SAGEMAKER_BIND_TO_PORT": str(port), "LMFORGE_HOST": "127.0.0.1"})
        log_path = folder / "container.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                [self.python, "-m", "lmforge", "serve", str(model_dir)],
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (folder / "container.pid").write_text(f"{process.pid}\n")
        container = Container(variant_name, port, process, folder, log_path)
        timeout = int(
            variant.get("ContainerStartupHealthCheckTimeoutInSeconds") or DEFAULT_HEALTH_CHECK_TIMEOUT_S
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stopping:
            if not container.alive:
                tail = container.log_tail()
                container.stop(0)
                raise ProvisionError(
                    f"The primary container for production variant {variant_name} exited with code "
                    f"{process.returncode} before passing the ping health check. Log {log_path}:\n{tail}"
                )
            if _ping(port):
                return container
            time.sleep(0.5)
        tail = container.log_tail()
        container.stop(5)
        raise ProvisionError(
            f"The primary container for production variant {variant_name} did not pass the ping health "
            f"check within {timeout} s (ContainerStartupHealthCheckTimeoutInSeconds). Log {log_path}:\n{tail}"
        )

    # ----- model data
    def _s3(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(retries={"max_attempts": 2}),
        )

    def _fetch_model_data(self, spec: Mapping[str, Any], model_dir: Path, *, deadline: float) -> None:
        model_dir.mkdir(parents=True, exist_ok=True)
        source = (spec.get("ModelDataSource") or {}).get("S3DataSource")
        url = spec.get("ModelDataUrl")
        try:
            if source is not None:
                compression = source.get("CompressionType", "None")
                if source.get("S3DataType", "S3Prefix") == "S3Prefix" and compression == "None":
                    self._download_prefix(source["S3Uri"], model_dir, deadline)
                else:
                    self._download_archive(source["S3Uri"], model_dir, deadline)
            elif url:
                self._download_archive(url, model_dir, deadline)
            # no model data at all: the container starts on an empty /opt/ml/model, like SageMaker
        except ProvisionError:
            raise
        except Exception as exc:
            raise ProvisionError(f"Failed to download model data: {type(exc).__name__}: {exc}") from exc

    def _download_archive(self, uri: str, model_dir: Path, deadline: float) -> None:
        from lmforge.artifacts import PackageError, safe_extract

        bucket, key = _split_s3(uri)
        with tempfile.TemporaryDirectory(dir=model_dir.parent) as tmp:
            archive = Path(tmp) / "model.tar.gz"
            self._s3().download_file(bucket, key, str(archive))
            self._check_deadline(deadline, uri)
            try:
                safe_extract(archive, model_dir)
            except PackageError as exc:
                raise ProvisionError(f"Refusing model data {uri}: {exc}") from exc

    def _download_prefix(self, uri: str, model_dir: Path, deadline: float) -> None:
        from lmforge.artifacts import PackageError, verify_folder

        bucket, prefix = _split_s3(uri)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        s3 = self._s3()
        count = 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :]
                if not rel or rel.endswith("/"):
                    continue
                parts = PurePosixPath(rel).parts
                if ".." in parts or rel.startswith("/"):
                    raise ProvisionError(
                        f"Refusing model data {uri}: object key {obj['Key']!r} escapes the prefix"
                    )
                target = model_dir.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, obj["Key"], str(target))
                count += 1
                self._check_deadline(deadline, uri)
        if count == 0:
            raise ProvisionError(f"Failed to download model data: no objects under {uri}")
        try:
            verify_folder(model_dir)
        except PackageError as exc:
            raise ProvisionError(f"Refusing model data {uri}: {exc}") from exc

    @staticmethod
    def _check_deadline(deadline: float, uri: str) -> None:
        if time.monotonic() > deadline:
            raise ProvisionError(
                f"Downloading {uri} took longer than ModelDataDownloadTimeoutInSeconds allows"
            )
