"""Start and stop the containers behind local endpoints and inference components.

For every production variant with a model (and for every inference component) the provisioner
has the Model's image (or its stand-in, :mod:`.runners`) ready, fetches the model data
(:mod:`.model_data`) into a fresh folder, starts the instance (:mod:`.containers`) with the
model's ``Environment`` and polls ``/ping`` until ``ContainerStartupHealthCheckTimeoutInSeconds``.
The endpoint then goes ``InService``, or ``Failed`` with a ``FailureReason`` that quotes the
container's log. A variant runs ``InitialInstanceCount`` instances (one container each), which
``UpdateEndpointWeightsAndCapacities`` (what Application Auto Scaling calls) grows or shrinks.

The rest lives beside it: routing invocations (:mod:`.routing`), restarting instances that die
(:mod:`.supervision`), adapter inference components (:mod:`.adapter_components`), the shared
registries (:mod:`.placements`).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from lmforge.local import ACCOUNT_ID, moto_ext
from lmforge.local.adapter_components import (
    DEFAULT_DOWNLOAD_TIMEOUT_S,
    DEFAULT_HEALTH_CHECK_TIMEOUT_S,
    FAILURE_REASON_MAX,
    AdapterComponents,
    allow_adapter_root,
)
from lmforge.local.containers import Container, ImageContainer, new_folder, reap_orphans
from lmforge.local.copies import Copies
from lmforge.local.model_data import ModelDataError, fetch_model_data, s3_client
from lmforge.local.placements import RANDOM, Deployment, ProvisionError, Route, RouteError
from lmforge.local.routing import Router
from lmforge.local.runners import ImageUnavailable, InstanceRunner
from lmforge.local.scaling import Scaling
from lmforge.local.supervision import Supervision
from lmforge.process import free_port

log = logging.getLogger("lmforge.local")

__all__ = ["ProvisionError", "Provisioner", "Route", "RouteError"]


class Provisioner(Router, AdapterComponents, Copies, Supervision, Scaling):
    """Implements :class:`lmforge.local.hooks.EndpointHooks` (the control plane's calls); routing,
    supervision, scaling, the copies of inference components and adapter components come from the
    classes it is made of."""

    def __init__(
        self,
        state_dir: Path,
        s3_endpoint_url: str,
        *,
        runner: InstanceRunner | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.runner = runner or InstanceRunner("process", None, state_dir=state_dir, account=ACCOUNT_ID)
        super().__init__(self.runner.account)
        self.state_dir = state_dir
        self.s3_endpoint_url = s3_endpoint_url
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._adapter_locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._next_restart: dict[int, float] = {}
        self._copies_init()

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

        endpoint_key = (backend.account_id, backend.region_name, endpoint_name)
        with self._lock:
            deployment = self._deployments.pop(endpoint_key, None)
            for key in [k for k in self._hosts if k[:3] == endpoint_key]:
                del self._hosts[key]
        if deployment is not None:
            self._stop_later(deployment.instances())
        store = components(backend)
        on_endpoint = [c for c in store.values() if c.endpoint_name == endpoint_name]
        for component in sorted(on_endpoint, key=lambda c: c.base_name is None):  # adapters first
            del store[component.name]
            self.component_deleted(backend, component)

    def component_created(self, backend: Any, component: Any) -> None:
        """A new inference component, or a new specification for one: start its copies (an adapter
        component: register it with its base's)."""
        if component.base_name:
            self._run(lambda: self._provision_component(backend, component), component.name)
            return
        with component.lock:
            component.generation += 1
        self._reconcile_later(backend, component.endpoint_name, component.variant_name)

    def component_scaling(self, backend: Any, component: Any) -> None:
        """``UpdateInferenceComponentRuntimeConfig``: start or stop copies to the new count."""
        if not component.base_name:
            self._reconcile_later(backend, component.endpoint_name, component.variant_name)

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
            self._drop(placed.copies)
        shutil.rmtree(self._adapter_root(key[0], key[1], component.name), ignore_errors=True)
        self._reconcile_later(backend, component.endpoint_name, component.variant_name)  # room, scale-in

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Stop every container and wait for all provisioning and stopping to finish."""
        self._stopping.set()
        with self._lock:
            containers = [c for d in self._deployments.values() for c in d.instances()]
            containers += [c for p in self._components.values() for c in p.containers]
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

    # ----- provisioning
    def _provision(self, backend: Any, endpoint: Any, config_name: str, update: bool) -> None:
        name = endpoint.endpoint_name
        started: dict[str, list[Container]] = {}
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
            self._stop_later([c for group in started.values() for c in group])
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
            routing={
                v["VariantName"]: (v.get("RoutingConfig") or {}).get("RoutingStrategy") or RANDOM
                for v in variants
            },
        )
        key = (backend.account_id, backend.region_name, name)
        with self._lock:  # atomic with endpoint_deleted's pop: a deleted endpoint is never registered
            current = not self._stopping.is_set() and backend.endpoints.get(name) is endpoint
            old = self._deployments.get(key) if current else None
            if current:
                self._deployments[key] = deployment
        if not current:
            self._stop_later(deployment.instances())
            return
        if update:
            moto_ext.finish_update(endpoint, backend, config_name)
        endpoint.failure_reason = None
        endpoint.endpoint_status = "InService"
        log.info(
            "endpoint %s is InService (%s)",
            name,
            ", ".join(f"{v}:{c.port}" for v, group in started.items() for c in group),
        )
        if old is not None:
            self._stop_later(old.instances())

    def _start_variant(
        self,
        backend: Any,
        endpoint_name: str,
        variant: dict[str, Any],
        started: dict[str, list[Container]],
        errors: list[str],
        count: int | None = None,
    ) -> None:
        """Start ``count`` (default: the variant's ``InitialInstanceCount``) instances of ``variant``
        at once into ``started[variant name]``; each failure is appended to ``errors``."""
        label = variant["VariantName"]
        group = started.setdefault(label, [])
        try:
            spec = self._model_container(backend, variant["ModelName"])
        except Exception as exc:
            errors.append(f"production variant {label}: {exc}")
            return

        def one() -> None:
            try:
                container = self._launch(
                    endpoint_name,
                    label,
                    spec,
                    variant,
                    memory_gib=_instance_memory_gib(variant.get("InstanceType")),
                )
                group.append(container)
            except ProvisionError as exc:
                errors.append(str(exc))
            except Exception as exc:
                errors.append(f"production variant {label}: {type(exc).__name__}: {exc}")

        wanted = count if count is not None else max(1, int(variant.get("InitialInstanceCount") or 1))
        threads = [threading.Thread(target=one) for _ in range(wanted)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _provision_component(self, backend: Any, component: Any) -> None:
        """An adapter component (base components are :class:`~lmforge.local.copies.Copies`')."""
        with component.lock:
            component.generation += 1
            generation = component.generation
        self._provision_adapter(backend, component, generation, component.status == "Updating")

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


def _instance_memory_gib(instance_type: object) -> float | None:
    """The host memory of a SageMaker instance type (None when lmforge's table lacks it)."""
    from lmforge.deploy.instances import get_instance

    try:
        return float(get_instance(str(instance_type)).host_memory_gib)
    except (ValueError, KeyError):
        return None
