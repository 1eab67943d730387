"""The copies of base inference components: each copy is a container, placed on one of its variant's
instances by its ``ComputeResourceRequirements`` against the instance type's cores, memory and
accelerators (lmforge's table, :mod:`lmforge.deploy.instances`); several components and copies share
an instance while they fit.

One reconciler per variant (:meth:`Copies._reconcile_later`) brings every component on it to its
``CopyCount``, oldest component first: it stops the idlest copies over the count, starts the missing
ones where they fit, and replaces all of a component's copies when its specification changed (the
new copies start beside the old ones, which stop once the new serve). A copy that fits nowhere starts
an instance when the variant has ``ManagedInstanceScaling`` (up to ``MaxInstanceCount``), else it
waits, and the component's ``CurrentCopyCount`` stays below its desired count until room is made.
Instances that hold no copy stop under managed instance scaling, down to ``MinInstanceCount`` (0
included). The endpoint's variant reports the instances as its ``CurrentInstanceCount``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from lmforge.local.adapter_components import FAILURE_REASON_MAX
from lmforge.local.containers import Container
from lmforge.local.placements import (
    Copy,
    Key,
    Needs,
    Placement,
    Placements,
    ProvisionError,
    VariantHosts,
    instance_capacity,
)

log = logging.getLogger("lmforge.local")

VariantKey = tuple[str, str, str, str]
"""(account, region, endpoint, variant)."""


class Copies(Placements):
    state_dir: Any
    s3_endpoint_url: str
    _launch: Callable[..., Container]
    _model_container: Callable[[Any, str], dict[str, Any]]
    _register_all: Callable[[Key, Container], None]
    _adapter_root: Callable[[str, str, str], Any]

    def _copies_init(self) -> None:
        self._dirty: set[VariantKey] = set()
        self._reconciling: set[VariantKey] = set()

    # ----- the variant's instances
    def _variant_hosts(self, backend: Any, endpoint_name: str, variant: str) -> VariantHosts | None:
        """The instances of ``variant`` (made from the endpoint configuration the first time), or None
        when the endpoint is gone."""
        key = (backend.account_id, backend.region_name, endpoint_name, variant)
        with self._lock:
            found = self._hosts.get(key)
        if found is not None:
            return found
        endpoint = backend.endpoints.get(endpoint_name)
        if endpoint is None:
            return None
        config = backend.describe_endpoint_config(endpoint.endpoint_config_name)
        spec = next((v for v in config["ProductionVariants"] if v["VariantName"] == variant), None)
        if spec is None:
            return None
        scaling = spec.get("ManagedInstanceScaling") or {}
        initial = int(spec.get("InitialInstanceCount") or 0)
        managed = scaling.get("Status") == "ENABLED"
        hosts = VariantHosts(
            instance_type=str(spec.get("InstanceType")),
            capacity=instance_capacity(spec.get("InstanceType")),
            hosts=[],
            managed=managed,
            min_count=int(scaling.get("MinInstanceCount", initial)) if managed else initial,
            max_count=int(scaling.get("MaxInstanceCount", initial)) if managed else initial,
        )
        for _ in range(initial):
            hosts.add()
        with self._lock:
            return self._hosts.setdefault(key, hosts)

    # ----- reconciling
    def _reconcile_later(self, backend: Any, endpoint_name: str, variant: str) -> None:
        """Bring the variant's components to their copy counts (one reconciler per variant at a time;
        a change while it runs makes it go round again)."""
        key = (backend.account_id, backend.region_name, endpoint_name, variant)
        with self._lock:
            self._dirty.add(key)
            if key in self._reconciling:
                return
            self._reconciling.add(key)
        self._run(lambda: self._reconcile(backend, key), f"copies-{endpoint_name}-{variant}")

    def _reconcile(self, backend: Any, key: VariantKey) -> None:
        from lmforge.local.inference_components import components

        endpoint_name, variant = key[2], key[3]
        try:
            while not self._stopping.is_set():
                with self._lock:
                    self._dirty.discard(key)
                hosts = self._variant_hosts(backend, endpoint_name, variant)
                if hosts is None:
                    break
                on_variant = sorted(
                    (
                        c
                        for c in list(components(backend).values())
                        if c.endpoint_name == endpoint_name and c.variant_name == variant and not c.base_name
                    ),
                    key=lambda c: c.created,
                )
                freed = False
                for component in on_variant:
                    freed |= self._settle(backend, component, hosts)
                with self._lock:
                    gone = hosts.scale_in()
                for host in gone:
                    log.info("endpoint %s variant %s: instance %s stopped", endpoint_name, variant, host.name)
                self._report_instances(backend, endpoint_name, variant, hosts)
                short = any(c.current_copies < c.copy_count for c in on_variant)
                with self._lock:
                    if freed and short:
                        self._dirty.add(key)
                    if key not in self._dirty:
                        self._reconciling.discard(key)
                        return
        finally:  # the next change starts a reconciler again
            with self._lock:
                self._reconciling.discard(key)

    def _settle(self, backend: Any, component: Any, hosts: VariantHosts) -> bool:
        """One component to its copy count (or onto its new specification); True when copies stopped."""
        key = (backend.account_id, backend.region_name, component.name)
        generation = component.generation
        with self._lock:
            placed = self._components.get(key)
        if placed is None and component.status == "Failed":
            return False  # its copies did not start; an UpdateInferenceComponent tries again
        if placed is None or placed.generation != generation:
            return self._replace(backend, component, hosts, placed, generation)
        want, have = component.copy_count, len(placed.copies)
        freed = False
        if want < have:
            with self._lock:  # the idlest go first; what they still serve ends before they stop
                placed.copies.sort(key=lambda c: c.container.outstanding, reverse=True)
                removed = placed.copies[want:]
                del placed.copies[want:]
                for copy in removed:
                    copy.host.release(copy.needs)
            self._stop_later([c.container for c in removed])
            freed = True
        elif want > have:
            started, errors = self._start_copies(backend, component, hosts, want - have)
            with self._lock:
                current = self._components.get(key) is placed
                current = current and self._current(backend, component, generation)
                if current:
                    placed.copies.extend(started)
            if not current:
                self._drop(started)
            elif errors:
                component.failure_reason = " ".join(errors)[:FAILURE_REASON_MAX]
        if self._current(backend, component, generation):
            component.current_copies = len(placed.copies)
            if component.status in ("Updating", "Creating"):
                component.status = "InService"
        return freed

    def _replace(
        self, backend: Any, component: Any, hosts: VariantHosts, placed: Placement | None, generation: int
    ) -> bool:
        """Start the copies of a new component, or of a new specification; the old copies stop once the
        new ones serve. A create whose copies fit nowhere stays ``Creating`` until they fit."""
        key = (backend.account_id, backend.region_name, component.name)
        updating = placed is not None
        if placed is not None and component.deployment_config:
            return self._roll(backend, component, hosts, placed, generation)
        started, errors = self._start_copies(backend, component, hosts, component.copy_count)
        if errors or (component.copy_count and not started):
            if errors or updating:
                reason = " ".join(errors) or (
                    f"No instance of {hosts.instance_type} has room for a copy of {component.name}."
                )
                self._drop(started)
                if component.generation == generation:
                    component.failure_reason = reason[:FAILURE_REASON_MAX]
                    component.status = "InService" if updating else "Failed"
                    if updating:  # the old copies keep serving the old specification
                        with self._lock:
                            if self._components.get(key) is placed and placed is not None:
                                placed.generation = generation
            return False  # nothing fits yet: Creating until room is made
        fresh = Placement(component.endpoint_name, component.variant_name, started, generation)
        with self._lock:
            current = self._current(backend, component, generation)
            if current:
                self._components[key] = fresh
        if not current:
            self._drop(started)
            return False
        component.failure_reason = None
        component.current_copies = len(started)
        component.status = "InService"
        log.info("inference component %s is InService with %d copies", component.name, len(started))
        if placed is not None:
            self._drop(placed.copies)
            return bool(placed.copies)
        return False

    def _roll(
        self, backend: Any, component: Any, hosts: VariantHosts, placed: Placement, generation: int
    ) -> bool:
        """A new specification by ``DeploymentConfig.RollingUpdatePolicy``: a batch of new copies
        starts, and once it serves as many old copies stop (they drain their requests), then the next
        batch after ``WaitIntervalInSeconds``; a batch that fails to start (or a rollback alarm in
        ``ALARM``) rolls back: the old specification's copies return in ``RollbackMaximumBatchSize``
        batches as the new ones stop. Returns True when copies stopped."""
        from lmforge.local.inference_components import batch_size

        config = component.deployment_config or {}
        policy = config.get("RollingUpdatePolicy") or {}
        alarms = [a["AlarmName"] for a in (config.get("AutoRollbackConfiguration") or {}).get("Alarms") or []]
        desired = component.copy_count
        step = batch_size(policy.get("MaximumBatchSize"), desired)
        wait_s = float(policy.get("WaitIntervalInSeconds") or 0)
        with self._lock:
            old = list(placed.copies)
        fresh: list[Copy] = []
        retired: list[Copy] = []
        log.info("inference component %s: rolling update in batches of %d copies", component.name, step)
        while len(fresh) < desired:
            if not self._current(backend, component, generation):
                self._drop_from(placed, fresh)
                return True
            count = min(step, desired - len(fresh))
            started, errors = self._start_copies(backend, component, hosts, count)
            firing = self._firing(backend, alarms)
            if errors or len(started) < count or firing:
                self._drop(started)
                reason = " ".join(errors) or (
                    f"alarm {firing} is in ALARM"
                    if firing
                    else f"No instance of {hosts.instance_type} has room for a copy of {component.name}."
                )
                self._roll_back(backend, component, hosts, placed, generation, fresh, len(retired), reason)
                return True
            with self._lock:
                placed.copies.extend(started)
                stop = old[:count]
                del old[:count]
                for copy in stop:
                    placed.copies.remove(copy)
                    copy.host.release(copy.needs)
                component.current_copies = len(placed.copies)
            self._stop_later([c.container for c in stop])
            fresh += started
            retired += stop
            if len(fresh) < desired and wait_s:
                self._stopping.wait(wait_s)
        with self._lock:
            for copy in old:
                placed.copies.remove(copy)
                copy.host.release(copy.needs)
            if self._current(backend, component, generation):
                placed.generation = generation
        self._stop_later([c.container for c in old])
        if self._current(backend, component, generation):
            component.failure_reason = None
            component.current_copies = len(placed.copies)
            component.status = "InService"
            log.info("inference component %s: rolled onto its new specification", component.name)
        return bool(retired or old)

    def _roll_back(
        self,
        backend: Any,
        component: Any,
        hosts: VariantHosts,
        placed: Placement,
        generation: int,
        fresh: list[Copy],
        retired: int,
        reason: str,
    ) -> None:
        """Bring back the ``retired`` copies of the previous specification, in rollback batches, as the
        ``fresh`` ones stop; the component is then ``InService`` on its previous specification with
        the ``FailureReason``."""
        from lmforge.local.inference_components import batch_size

        policy = (component.deployment_config or {}).get("RollingUpdatePolicy") or {}
        previous = component.previous_specification or component.specification
        # without a RollbackMaximumBatchSize, SageMaker brings the whole old fleet back at once
        step = batch_size(policy.get("RollbackMaximumBatchSize"), retired)
        log.warning("inference component %s: rolling back (%s)", component.name, reason)
        errors: list[str] = []
        while retired > 0 and self._current(backend, component, generation):
            count = min(step, retired)
            started, failed = self._start_copies(backend, component, hosts, count, spec=previous)
            errors += failed
            with self._lock:
                placed.copies.extend(started)
            self._drop_from(placed, fresh[:count])
            del fresh[:count]
            retired -= count
        self._drop_from(placed, fresh)
        if not self._current(backend, component, generation):
            return
        with self._lock:
            placed.generation = generation
            component.current_copies = len(placed.copies)
        component.specification = previous
        detail = f" (the rollback could not restart every copy: {' '.join(errors)})" if errors else ""
        component.failure_reason = f"Rolled back to the previous specification: {reason}{detail}"[
            :FAILURE_REASON_MAX
        ]
        component.status = "InService"

    def _drop_from(self, placed: Placement, copies: list[Copy]) -> None:
        """Take ``copies`` out of the component's routing, then stop them."""
        with self._lock:
            for copy in copies:
                if copy in placed.copies:
                    placed.copies.remove(copy)
        self._drop(copies)

    def _firing(self, backend: Any, alarms: list[str]) -> str | None:
        """The first of ``alarms`` (``AutoRollbackConfiguration``) in ``ALARM`` in the local CloudWatch."""
        if not alarms:
            return None
        import boto3

        cloudwatch = boto3.session.Session().client(
            "cloudwatch",
            endpoint_url=self.s3_endpoint_url,
            region_name=backend.region_name,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        found = cloudwatch.describe_alarms(AlarmNames=alarms).get("MetricAlarms", [])
        return next((a["AlarmName"] for a in found if a.get("StateValue") == "ALARM"), None)

    def _current(self, backend: Any, component: Any, generation: int) -> bool:
        from lmforge.local.inference_components import components

        return (
            not self._stopping.is_set()
            and component.generation == generation
            and components(backend).get(component.name) is component
        )

    def _drop(self, copies: list[Copy]) -> None:
        """Stop copies and give their room back."""
        with self._lock:
            for copy in copies:
                copy.host.release(copy.needs)
        self._stop_later([c.container for c in copies])

    def _start_copies(
        self,
        backend: Any,
        component: Any,
        hosts: VariantHosts,
        count: int,
        spec: Mapping[str, Any] | None = None,
    ) -> tuple[list[Copy], list[str]]:
        """Reserve room for up to ``count`` copies (of ``spec``, default the component's) and start
        them at once; (the copies serving, the errors of those that did not start)."""
        if count <= 0:
            return [], []
        spec = component.specification if spec is None else spec
        needs = Needs.of(spec)
        with self._lock:
            reserved = [h for _ in range(count) if (h := hosts.place(needs)) is not None]
        if not reserved:
            return [], []
        key = (backend.account_id, backend.region_name, component.name)
        try:
            container_spec = self._component_container(backend, spec)
        except Exception as exc:
            with self._lock:
                for host in reserved:
                    host.release(needs)
            return [], [_reason(exc)]
        started: list[Copy] = []
        errors: list[str] = []

        def one(host: Any) -> None:
            try:
                container = self._launch(
                    component.endpoint_name,
                    component.name,
                    container_spec,
                    spec.get("StartupParameters") or {},
                    adapter_root=self._adapter_root(*key),
                    memory_gib=needs.memory_mb / 1024 if needs.memory_mb else None,
                )
                # a new copy of a base component: its adapter components are registered before it serves
                self._register_all(key, container)
                started.append(Copy(container, host, needs))
            except Exception as exc:
                with self._lock:
                    host.release(needs)
                errors.append(_reason(exc))

        threads = [threading.Thread(target=one, args=(h,)) for h in reserved]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return started, errors

    def _component_container(self, backend: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The container a copy runs: the ``ModelName``'s, with the ``Container``'s image, artifact and
        environment over it."""
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
        return container_spec

    def _report_instances(self, backend: Any, endpoint_name: str, variant: str, hosts: VariantHosts) -> None:
        endpoint = backend.endpoints.get(endpoint_name)
        if endpoint is None:
            return
        for row in endpoint.production_variants:
            if row.get("VariantName") == variant:
                row["CurrentInstanceCount"] = row["DesiredInstanceCount"] = len(hosts.hosts)


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, ProvisionError) else f"{type(exc).__name__}: {exc}"
