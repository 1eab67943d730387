"""Start, supervise and stop the containers behind local endpoints and inference components.

For every production variant with a model (and for every inference component) the provisioner
fetches the model data (:mod:`.model_data`) into a fresh folder, starts a container
(:mod:`.containers`) with the model's ``Environment`` and polls ``/ping`` until
``ContainerStartupHealthCheckTimeoutInSeconds``. The endpoint then goes ``InService``, or ``Failed``
with a ``FailureReason`` that quotes the container's log. One process stands for a variant whatever
its instance count. A container that dies later is restarted (SageMaker replaces a failed
instance); until it answers again, invocations get a ``ModelError``.

Adapter inference components (``BaseInferenceComponentName``) get no container of their own: the
adapter is downloaded from ``Container.ArtifactUrl`` (a ``.tar.gz`` or an S3 prefix) into
``<state>/adapters/<account>/<region>/<base component>/``, a folder the base component's container
may read (its ``LMFORGE_ADAPTER_ROOTS``), and registered there through the adapters API
(``POST /adapters``, name = the adapter component's name). Invocations of the adapter component go
to the base's container with ``X-Amzn-SageMaker-Adapter-Identifier``. An update re-registers it
(``PUT /adapters/NAME``), a delete deregisters it and removes its files, and a base container that
is restarted or replaced gets its adapters registered again.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from lmforge.adapters.sources import PLATFORM_ADAPTER_ROOTS_ENV
from lmforge.local import moto_ext
from lmforge.local.containers import Container, ImageContainer, free_port, new_folder, reap_orphans
from lmforge.local.model_data import ModelDataError, fetch_model_data, s3_client
from lmforge.local.runners import ImageUnavailable, InstanceRunner

log = logging.getLogger("lmforge.local")

DEFAULT_HEALTH_CHECK_TIMEOUT_S = 240  # SageMaker's default: pass /ping within 4 minutes
DEFAULT_DOWNLOAD_TIMEOUT_S = 3600
FAILURE_REASON_MAX = 1024
WATCH_EVERY_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0
ADAPTER_CALL_TIMEOUT_S = 300.0  # registering may load the adapter (preload) before answering


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


@dataclass
class AdapterPlacement:
    """An adapter component registered with its base component's container."""

    endpoint_name: str
    variant: str
    base: str
    folder: Path
    """What was downloaded (removed with the registration)."""
    src: Path
    """The adapter folder registered (``folder`` or the one folder inside it)."""


@dataclass(frozen=True)
class Route:
    """Where the runtime sends one invocation."""

    account: str
    region: str
    endpoint_name: str
    endpoint_arn: str
    variant: str
    port: int
    adapter: str | None = None
    """The adapter component's name: sent as ``X-Amzn-SageMaker-Adapter-Identifier``."""


class Provisioner:
    """Implements :class:`lmforge.local.moto_ext.EndpointHooks`; also answers the runtime's lookups."""

    def __init__(
        self,
        state_dir: Path,
        s3_endpoint_url: str,
        *,
        runner: InstanceRunner | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.s3_endpoint_url = s3_endpoint_url
        self.runner = runner or InstanceRunner("process", None, state_dir=state_dir, account="123456789012")
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._lock = threading.Lock()
        self._deployments: dict[tuple[str, str, str], Deployment] = {}
        self._components: dict[tuple[str, str, str], Placement] = {}
        self._adapters: dict[tuple[str, str, str], AdapterPlacement] = {}
        self._adapter_locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._next_restart: dict[int, float] = {}

    def start(self) -> None:
        """Clean up after an earlier run that crashed, then supervise containers."""
        reap_orphans(self.state_dir, self.runner.any_engine)
        shutil.rmtree(self.state_dir / "adapters", ignore_errors=True)  # their base containers are gone
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
        on_endpoint = [c for c in store.values() if c.endpoint_name == endpoint_name]
        for component in sorted(on_endpoint, key=lambda c: c.base_name is None):  # adapters first
            del store[component.name]
            self.component_deleted(backend, component)

    def component_created(self, backend: Any, component: Any) -> None:
        """A new inference component, or a new specification for one: start its container."""
        self._run(lambda: self._provision_component(backend, component), component.name)

    def component_deleted(self, backend: Any, component: Any) -> None:
        key = (backend.account_id, backend.region_name, component.name)
        if component.base_name:
            with self._lock:  # no invocation is routed to it from now on
                placement = self._adapters.pop(key, None)
            if placement is not None:
                self._run(partial(self._remove_adapter, key, placement), f"deregister-{component.name}")
            return
        with self._lock:
            placed = self._components.pop(key, None)
        if placed is not None:
            self._stop_later([placed.container])
        shutil.rmtree(self._adapter_root(key[0], key[1], component.name), ignore_errors=True)

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
            adapter = [
                (a, self._components.get((acct, reg, a.base)))
                for (acct, reg, name), a in self._adapters.items()
                if name == component and (region is None or reg == region)
            ]
        if not found:
            if self._known(region, endpoint_name):
                raise RouteError(f"Endpoint {endpoint_name} is not in service yet; wait for InService.")
            raise RouteError(f"Endpoint {endpoint_name} of account 123456789012 not found.")
        deployment = found[0]
        if component is not None and adapter and adapter[0][0].endpoint_name == endpoint_name:
            placement, base = adapter[0]
            if base is None:
                raise RouteError(
                    f"Inference component {component} is not in service on endpoint {endpoint_name} "
                    f"(its base inference component {placement.base} is not)."
                )
            return Route(
                deployment.account,
                deployment.region,
                endpoint_name,
                deployment.endpoint_arn,
                placement.variant,
                base.container.port,
                adapter=component,
            )
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
        with self._lock:
            self._adapters.clear()
        shutil.rmtree(self.state_dir / "adapters", ignore_errors=True)  # downloads, like the model copies

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
                self._run(partial(self._reregister_after_restart, container), f"adapters-{container.label}")

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
            started[label] = self._launch(
                endpoint_name,
                label,
                spec,
                variant,
                memory_gib=_instance_memory_gib(variant.get("InstanceType")),
            )
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
        if spec.get("BaseInferenceComponentName"):
            self._provision_adapter(backend, component, generation, updating)
            return
        key = (backend.account_id, backend.region_name, component.name)
        try:
            container_spec: dict[str, Any] = {}
            if spec.get("ModelName"):
                container_spec = self._model_container(backend, spec["ModelName"])
            extra = spec.get("Container") or {}
            if extra.get("ArtifactUrl"):
                container_spec["ModelDataUrl"] = extra["ArtifactUrl"]
                container_spec.pop("ModelDataSource", None)
            if extra.get("Image"):
                container_spec["Image"] = extra["Image"]
            container_spec["Environment"] = {
                **(container_spec.get("Environment") or {}),
                **(extra.get("Environment") or {}),
            }
            container = self._launch(
                component.endpoint_name,
                component.name,
                container_spec,
                spec.get("StartupParameters") or {},
                adapter_root=self._adapter_root(*key),
                memory_gib=_component_memory_gib(spec),
            )
            # a new container for a base component: its adapter components move to it before it serves
            self._register_all(key, container)
        except Exception as exc:
            reason = str(exc) if isinstance(exc, ProvisionError) else f"{type(exc).__name__}: {exc}"
            if component.generation == generation:
                component.failure_reason = reason[:FAILURE_REASON_MAX]
                component.status = "InService" if updating else "Failed"
            return
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
        self,
        endpoint_name: str,
        label: str,
        spec: Mapping[str, Any],
        timeouts: Mapping[str, Any],
        adapter_root: Path | None = None,
        memory_gib: float | None = None,
    ) -> Container:
        """Fetch the image and the model data, start the instance and wait for ``/ping``;
        ProvisionError otherwise. ``adapter_root``: a folder the container may register adapters
        from (``LMFORGE_ADAPTER_ROOTS``; mounted read-only at the same path in an image)."""
        download_s = float(timeouts.get("ModelDataDownloadTimeoutInSeconds") or DEFAULT_DOWNLOAD_TIMEOUT_S)
        image = str(spec.get("Image") or "")
        try:
            plan = self.runner.plan(image, timeout_s=download_s)
        except ImageUnavailable as exc:
            raise ProvisionError(str(exc)) from None
        folder = new_folder(self.state_dir, endpoint_name, label)
        port = free_port()
        container = self.runner.create(
            plan,
            label=label,
            folder=folder,
            port=port,
            model_env=spec.get("Environment") or {},
            s3_url=self.s3_endpoint_url,
            base_env=self.base_env,
            memory_gib=memory_gib,
        )
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
        if adapter_root is not None:
            adapter_root.mkdir(parents=True, exist_ok=True)
            allow_adapter_root(container.env, adapter_root)
            if isinstance(container, ImageContainer):
                container.mounts.append(adapter_root)
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

    # ----- adapter inference components
    def _adapter_root(self, account: str, region: str, base: str) -> Path:
        return self.state_dir / "adapters" / account / region / base

    def _adapter_lock(self, key: tuple[str, str, str]) -> threading.Lock:
        with self._lock:
            return self._adapter_locks.setdefault(key, threading.Lock())

    def _provision_adapter(self, backend: Any, component: Any, generation: int, updating: bool) -> None:
        """Download the adapter and register it with the base component's container."""
        from lmforge.local.inference_components import components

        key = (backend.account_id, backend.region_name, component.name)
        spec = component.specification
        base = str(spec["BaseInferenceComponentName"])
        startup = spec.get("StartupParameters") or {}
        with self._adapter_lock(key):
            folder: Path | None = None
            try:
                container = self._wait_for_base(backend, base, component)
                download_s = float(
                    startup.get("ModelDataDownloadTimeoutInSeconds") or DEFAULT_DOWNLOAD_TIMEOUT_S
                )
                folder, src = self._fetch_adapter(
                    (spec.get("Container") or {}).get("ArtifactUrl"),
                    self._adapter_root(key[0], key[1], base),
                    component.name,
                    download_s,
                )
                with self._lock:
                    previous = self._adapters.get(key)
                self._register(container, base, component.name, src, update=previous is not None)
            except Exception as exc:
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
                reason = str(exc) if isinstance(exc, ProvisionError) else f"{type(exc).__name__}: {exc}"
                log.warning("adapter inference component %s failed: %s", component.name, reason)
                if component.generation == generation:
                    component.failure_reason = reason[:FAILURE_REASON_MAX]
                    component.status = "InService" if updating else "Failed"
                return
            placement = AdapterPlacement(component.endpoint_name, component.variant_name, base, folder, src)
            with self._lock:
                registered: Any = components(backend).get(component.name)
                current = (
                    not self._stopping.is_set()
                    and registered is component
                    and generation == component.generation
                )
                old = self._adapters.get(key) if current else None
                if current:
                    self._adapters[key] = placement
            if not current:
                if components(backend).get(component.name) is not component:  # deleted meanwhile
                    self._deregister(container, component.name)
                shutil.rmtree(folder, ignore_errors=True)
                return
            component.failure_reason = None
            component.current_copies = component.copy_count
            component.status = "InService"
            log.info("adapter inference component %s is InService on %s", component.name, base)
            if old is not None and old.folder != folder:
                shutil.rmtree(old.folder, ignore_errors=True)

    def _wait_for_base(self, backend: Any, base: str, adapter: Any) -> Container:
        """The base component's container once it serves; ProvisionError when it never will."""
        from lmforge.local.inference_components import components

        key = (backend.account_id, backend.region_name, base)
        name = str(adapter.name)
        deadline = time.monotonic() + DEFAULT_HEALTH_CHECK_TIMEOUT_S
        while not self._stopping.is_set():
            if components(backend).get(name) is not adapter:
                raise ProvisionError(f"{name} was deleted")
            component = components(backend).get(base)
            if component is None:
                raise ProvisionError(f"The base inference component {base} of {name} no longer exists.")
            with self._lock:
                placed = self._components.get(key)
            if placed is not None and placed.container.alive:
                return placed.container
            if component.status == "Failed":
                why = component.failure_reason or "no reason given"
                raise ProvisionError(f"The base inference component {base} is Failed ({why}).")
            if time.monotonic() > deadline:
                raise ProvisionError(f"The base inference component {base} did not come into service in time")
            time.sleep(0.3)
        raise ProvisionError("the local SageMaker is stopping")

    def _fetch_adapter(self, url: Any, root: Path, name: str, timeout_s: float) -> tuple[Path, Path]:
        """Download ``url`` (a ``.tar.gz`` or an S3 prefix) into a fresh folder under ``root``; returns
        (that folder, the adapter folder: itself, or the one folder it holds when that has the adapter)."""
        if not isinstance(url, str) or not url.startswith("s3://"):
            raise ProvisionError(
                "Specification.Container.ArtifactUrl must give the adapter's S3 location (s3://...)"
            )
        folder = root / f"{name}-{uuid.uuid4().hex[:8]}"
        if url.endswith((".tar.gz", ".tgz")):
            spec: dict[str, Any] = {"ModelDataUrl": url}
        else:
            source = {"S3Uri": url.rstrip("/") + "/", "S3DataType": "S3Prefix", "CompressionType": "None"}
            spec = {"ModelDataSource": {"S3DataSource": source}}
        try:
            fetch_model_data(spec, folder, s3=s3_client(self.s3_endpoint_url), timeout_s=timeout_s)
        except ModelDataError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise ProvisionError(f"Could not download the adapter from {url}: {exc}") from None
        src = folder
        if not (folder / "adapter_config.json").exists():
            entries = [p for p in folder.iterdir() if p.name != "lmforge-manifest.json"]
            if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
                src = entries[0]  # a tarball of the adapter's folder rather than of its files
        return folder, src

    def _register(self, container: Container, base: str, name: str, src: Path, *, update: bool) -> None:
        """Register (or update) adapter ``name`` with the base's container; ProvisionError on refusal."""
        body = {"src": str(src)}
        headers = {"X-Amzn-SageMaker-Adapter-Alias": name}
        if update:
            status, answer = _call(container.port, "PUT", f"/adapters/{name}", body, headers)
            if status != 404:
                _check_answer(status, answer, base, name)
                return
        status, answer = _call(container.port, "POST", "/adapters", {"name": name, **body}, headers)
        _check_answer(status, answer, base, name)

    def _deregister(self, container: Container, name: str) -> None:
        try:
            status, answer = _call(container.port, "DELETE", f"/adapters/{name}", None, {})
        except OSError as exc:  # the container is gone: so is the registration
            log.info("adapter %s not deregistered: %s", name, exc)
            return
        if status not in (200, 404):
            log.warning("deregistering adapter %s answered %s: %s", name, status, answer.get("message"))

    def _remove_adapter(self, key: tuple[str, str, str], placement: AdapterPlacement) -> None:
        """DeleteInferenceComponent of an adapter component: deregister it, then drop its files."""
        with self._adapter_lock(key):
            with self._lock:
                base = self._components.get((key[0], key[1], placement.base))
            if base is not None:
                self._deregister(base.container, key[2])
            shutil.rmtree(placement.folder, ignore_errors=True)

    def _register_all(self, base_key: tuple[str, str, str], container: Container) -> None:
        """Register every adapter component of a base with ``container`` (a new or restarted one)."""
        with self._lock:
            adapters = [
                (k, a)
                for k, a in self._adapters.items()
                if (k[0], k[1]) == base_key[:2] and a.base == base_key[2]
            ]
        for key, placement in adapters:
            try:
                self._register(container, placement.base, key[2], placement.src, update=False)
            except (ProvisionError, OSError) as exc:
                log.warning("adapter %s could not be registered again: %s", key[2], exc)

    def _reregister_after_restart(self, container: Container) -> None:
        with self._lock:
            keys = [k for k, p in self._components.items() if p.container is container]
        if not keys or not container.wait_healthy(DEFAULT_HEALTH_CHECK_TIMEOUT_S):
            return
        self._register_all(keys[0], container)


def allow_adapter_root(env: dict[str, str], root: Path) -> None:
    """Let the container register adapters from ``root`` (the platform's download folder): added to
    ``LMFORGE_ADAPTER_ROOTS``, which adds to whatever ``option.adapter_roots`` the model sets."""
    roots = [r for r in env.get(PLATFORM_ADAPTER_ROOTS_ENV, "").split(",") if r.strip()]
    env[PLATFORM_ADAPTER_ROOTS_ENV] = ",".join([*roots, str(root)])


def _call(
    port: int, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    """One JSON call to a container's adapters API: (status, decoded answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ADAPTER_CALL_TIMEOUT_S)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={**headers, "Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        answer = json.loads(raw) if raw else {}
    except ValueError:
        answer = {"message": raw.decode("utf-8", errors="replace")[:500]}
    return response.status, answer if isinstance(answer, dict) else {"message": str(answer)}


def _check_answer(status: int, answer: dict[str, Any], base: str, name: str) -> None:
    if status != 200:
        raise ProvisionError(
            f"The container of base inference component {base} refused adapter {name} "
            f"(status {status}): {answer.get('message') or answer}"
        )


def _instance_memory_gib(instance_type: object) -> float | None:
    """The host memory of a SageMaker instance type (None when lmforge's table lacks it)."""
    from lmforge.deploy.instances import get_instance

    try:
        return float(get_instance(str(instance_type)).host_memory_gib)
    except (ValueError, KeyError):
        return None


def _component_memory_gib(spec: Mapping[str, Any]) -> float | None:
    """An inference component's ``ComputeResourceRequirements.MinMemoryRequiredInMb`` in GiB."""
    needs = spec.get("ComputeResourceRequirements") or {}
    try:
        return float(needs["MinMemoryRequiredInMb"]) / 1024
    except (KeyError, TypeError, ValueError):
        return None
