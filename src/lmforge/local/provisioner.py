"""Start, supervise and stop the containers behind local endpoints and inference components.

For every production variant with a model (and for every inference component) the provisioner
fetches the model data (:mod:`.model_data`) into a fresh folder, starts a container
(:mod:`.containers`) with the model's ``Environment`` and polls ``/ping`` until
``ContainerStartupHealthCheckTimeoutInSeconds``. The endpoint then goes ``InService``, or ``Failed``
with a ``FailureReason`` that quotes the container's log. One process stands for a variant whatever
its instance count. A container that dies later is restarted (SageMaker replaces a failed
instance); until it answers again, invocations get a ``ModelError``.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.local import moto_ext
from lmforge.local.containers import Container, container_env, free_port, new_folder, reap_orphans
from lmforge.local.model_data import ModelDataError, fetch_model_data, s3_client

log = logging.getLogger("lmforge.local")

DEFAULT_HEALTH_CHECK_TIMEOUT_S = 240  # SageMaker's default: pass /ping within 4 minutes
DEFAULT_DOWNLOAD_TIMEOUT_S = 3600
FAILURE_REASON_MAX = 1024
WATCH_EVERY_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0


class ProvisionError(Exception):
    """A container that could not be started; the message becomes the FailureReason."""


class RouteError(Exception):
    """An invocation that cannot be routed; the runtime answers it as a ValidationError."""


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


@dataclass
class Placement:
    """The container of one inference component."""

    endpoint_name: str
    variant: str
    container: Container


@dataclass(frozen=True)
class Route:
    """Where the runtime sends one invocation."""

    account: str
    region: str
    endpoint_name: str
    endpoint_arn: str
    variant: str
    port: int


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
        self._components: dict[tuple[str, str, str], Placement] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._next_restart: dict[int, float] = {}

    def start(self) -> None:
        """Clean up after an earlier run that crashed, then supervise containers."""
        reap_orphans(self.state_dir)
        self._run(self._watch, "container-watchdog")

    # ----- hooks called by the control plane (inside a moto request: they must not block)
    def endpoint_created(self, backend: Any, endpoint: Any) -> None:
        self._run(
            lambda: self._provision(backend, endpoint, endpoint.endpoint_config_name, False),
            endpoint.endpoint_name,
        )

    def endpoint_updating(self, backend: Any, endpoint: Any, endpoint_config_name: str) -> None:
        self._run(
            lambda: self._provision(backend, endpoint, endpoint_config_name, True), endpoint.endpoint_name
        )

    def endpoint_deleted(self, backend: Any, endpoint_name: str) -> None:
        from lmforge.local.inference_components import components

        with self._lock:
            deployment = self._deployments.pop((backend.account_id, backend.region_name, endpoint_name), None)
        if deployment is not None:
            self._stop_later(list(deployment.containers.values()))
        store = components(backend)
        for component in [c for c in store.values() if c.endpoint_name == endpoint_name]:
            del store[component.name]
            self.component_deleted(backend, component)

    def component_created(self, backend: Any, component: Any) -> None:
        """A new inference component, or a new specification for one: start its container."""
        self._run(lambda: self._provision_component(backend, component), component.name)

    def component_deleted(self, backend: Any, component: Any) -> None:
        with self._lock:
            placed = self._components.pop((backend.account_id, backend.region_name, component.name), None)
        if placed is not None:
            self._stop_later([placed.container])

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
                p
                for (_, reg, name), p in self._components.items()
                if name == component and (region is None or reg == region)
            ]
        if not found:
            if self._known(region, endpoint_name):
                raise RouteError(f"Endpoint {endpoint_name} is not in service yet; wait for InService.")
            raise RouteError(f"Endpoint {endpoint_name} of account 123456789012 not found.")
        deployment = found[0]
        if component is not None:
            if not placed or placed[0].endpoint_name != endpoint_name:
                raise RouteError(
                    f"Inference component {component} is not in service on endpoint {endpoint_name}."
                )
            p = placed[0]
            return Route(
                deployment.account,
                deployment.region,
                endpoint_name,
                deployment.endpoint_arn,
                p.variant,
                p.container.port,
            )
        if not deployment.containers:
            raise RouteError(
                "Inference Component Name header is required for endpoints to which you plan to deploy "
                "inference components. Please include Inference Component Name header or consider using "
                "SageMaker models."
            )
        if target_variant is not None:
            if target_variant not in deployment.containers:
                raise RouteError(f"Endpoint {endpoint_name} has no production variant {target_variant!r}.")
            variant = target_variant
        else:
            live = sorted(v for v, c in deployment.containers.items() if c.alive)
            if live:
                weights = [deployment.weights.get(n, 1.0) for n in live]
                variant = random.choices(live, weights=weights if sum(weights) > 0 else None)[0]
            else:  # being restarted: the runtime reports it as a model error
                variant = sorted(deployment.containers)[0]
        return Route(
            deployment.account,
            deployment.region,
            endpoint_name,
            deployment.endpoint_arn,
            variant,
            deployment.containers[variant].port,
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

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop every container and wait for all provisioning and stopping to finish."""
        self._stopping.set()
        with self._lock:
            containers = [c for d in self._deployments.values() for c in d.containers.values()]
            containers += [p.container for p in self._components.values()]
            self._deployments.clear()
            self._components.clear()
        self._stop_later(containers)
        deadline = time.monotonic() + timeout_s
        for thread in list(self._threads):
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    # ----- threads
    def _run(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"lmforge-{name}", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _stop_later(self, containers: list[Container]) -> None:
        for container in containers:
            container.stopping = True
            self._run(container.stop, f"stop-{container.label}")

    def _watch(self) -> None:
        """Restart containers that die while registered (with backoff), as SageMaker replaces instances."""
        while not self._stopping.wait(WATCH_EVERY_S):
            with self._lock:
                registered = [c for d in self._deployments.values() for c in d.containers.values()]
                registered += [p.container for p in self._components.values()]
            now = time.monotonic()
            for container in registered:
                if container.alive or container.stopping:
                    continue
                key = id(container)
                if now < self._next_restart.get(key, 0.0):
                    continue
                container.restarts += 1
                backoff = min(MAX_RESTART_BACKOFF_S, 2.0 ** (container.restarts - 1))
                self._next_restart[key] = now + backoff
                log.warning(
                    "container %s exited with code %s; restarting it (restart %d)",
                    container.folder,
                    container.returncode,
                    container.restarts,
                )
                container.start()

    # ----- provisioning
    def _provision(self, backend: Any, endpoint: Any, config_name: str, update: bool) -> None:
        name = endpoint.endpoint_name
        started: dict[str, Container] = {}
        try:
            variants = backend.describe_endpoint_config(config_name)["ProductionVariants"]
            errors: list[str] = []
            threads = []
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
        deployment = Deployment(
            account=backend.account_id,
            region=backend.region_name,
            endpoint_name=name,
            endpoint_arn=endpoint.arn,
            config_name=config_name,
            containers=started,
            weights={v["VariantName"]: float(v.get("InitialVariantWeight", 1.0)) for v in variants},
        )
        key = (backend.account_id, backend.region_name, name)
        with self._lock:  # atomic with endpoint_deleted's pop: a deleted endpoint is never registered
            current = not self._stopping.is_set() and backend.endpoints.get(name) is endpoint
            old = self._deployments.get(key) if current else None
            if current:
                self._deployments[key] = deployment
        if not current:
            self._stop_later(list(started.values()))
            return
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
        label = variant["VariantName"]
        try:
            spec = self._model_container(backend, variant["ModelName"])
            started[label] = self._launch(endpoint_name, label, spec, variant)
        except ProvisionError as exc:
            errors.append(str(exc))
        except Exception as exc:
            errors.append(f"production variant {label}: {type(exc).__name__}: {exc}")

    def _provision_component(self, backend: Any, component: Any) -> None:
        from lmforge.local.inference_components import components

        with component.lock:
            component.generation += 1
            generation = component.generation
        updating = component.status == "Updating"
        spec = component.specification
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
            container_spec["Environment"] = {
                **(container_spec.get("Environment") or {}),
                **(extra.get("Environment") or {}),
            }
            container = self._launch(
                component.endpoint_name, component.name, container_spec, spec.get("StartupParameters") or {}
            )
        except Exception as exc:
            reason = str(exc) if isinstance(exc, ProvisionError) else f"{type(exc).__name__}: {exc}"
            if component.generation == generation:
                component.failure_reason = reason[:FAILURE_REASON_MAX]
                component.status = "InService" if updating else "Failed"
            return
        key = (backend.account_id, backend.region_name, component.name)
        with self._lock:
            registered = components(backend).get(component.name)
            current = (
                not self._stopping.is_set()
                and registered is not None
                and registered is component
                and registered.generation == generation
            )
            old = self._components.get(key) if current else None
            if current:
                self._components[key] = Placement(component.endpoint_name, component.variant_name, container)
        if not current:
            self._stop_later([container])
            return
        component.failure_reason = None
        component.current_copies = component.copy_count
        component.status = "InService"
        if old is not None:
            self._stop_later([old.container])

    @staticmethod
    def _model_container(backend: Any, model_name: str) -> dict[str, Any]:
        model = backend.describe_model(model_name)
        spec = model.primary_container or (model.containers[0] if model.containers else None)
        if not spec:
            raise ProvisionError(f"model {model_name} has no container definition")
        return dict(spec)

    def _launch(
        self, endpoint_name: str, label: str, spec: Mapping[str, Any], timeouts: Mapping[str, Any]
    ) -> Container:
        """Fetch the model data, start ``lmforge serve`` and wait for ``/ping``; ProvisionError otherwise."""
        folder = new_folder(self.state_dir, endpoint_name, label)
        port = free_port()
        env = container_env(self.base_env, spec.get("Environment") or {}, port, self.s3_endpoint_url)
        container = Container(label, folder, port, env, python=self.python)
        download_s = float(timeouts.get("ModelDataDownloadTimeoutInSeconds") or DEFAULT_DOWNLOAD_TIMEOUT_S)
        try:
            fetch_model_data(
                spec, container.model_dir, s3=s3_client(self.s3_endpoint_url), timeout_s=download_s
            )
        except ModelDataError as exc:
            container.stop(0)
            raise ProvisionError(str(exc)) from None
        if self._stopping.is_set():
            container.stop(0)
            raise ProvisionError("the local SageMaker is stopping")
        container.start()
        health_s = float(
            timeouts.get("ContainerStartupHealthCheckTimeoutInSeconds") or DEFAULT_HEALTH_CHECK_TIMEOUT_S
        )
        if container.wait_healthy(health_s):
            return container
        exited = container.returncode
        tail = container.log_tail()
        container.stop(5)
        if exited is not None:
            raise ProvisionError(
                f"The primary container for {label} exited with code {exited} before passing the ping "
                f"health check. Log {container.log_path}:\n{tail}"
            )
        raise ProvisionError(
            f"The primary container for {label} did not pass the ping health check within {health_s:.0f} s "
            f"(ContainerStartupHealthCheckTimeoutInSeconds). Log {container.log_path}:\n{tail}"
        )
