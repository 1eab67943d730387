"""Routing an invocation to the container that serves it: a production variant (by
``TargetVariant`` or by weight among live ones), an inference component, or an adapter component
(its base component's container, with the adapter named in a header).

An inference component's invocation goes to one of its copies, chosen by the variant's routing
strategy; one with no copy is refused as SageMaker refuses it (:data:`NO_CAPACITY`).

Within a variant, one of its instances: the one holding the request's sticky session, else as the
variant's ``RoutingConfig.RoutingStrategy`` says: ``RANDOM`` (SageMaker's default) or
``LEAST_OUTSTANDING_REQUESTS`` (the instance with the fewest invocations in flight, ties broken at
random). The router counts each instance's outstanding and total invocations; the runtime reports
when one ends (:meth:`Router.finished`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from lmforge.local.containers import Container
from lmforge.local.metrics import component_dims, endpoint_dims
from lmforge.local.placements import (
    LEAST_OUTSTANDING_REQUESTS,
    RANDOM,
    NoCapacity,
    Placements,
    Route,
    RouteError,
)

#: the sticky sessions the router remembers (the oldest are forgotten first)
MAX_SESSIONS = 100_000
#: SageMaker's answer to an invocation of an inference component that has no copy
NO_CAPACITY = (
    "Inference Component has no capacity to process this request. ApplicationAutoScaling may be "
    "in-progress (if configured) or try to increase the capacity by invoking "
    "UpdateInferenceComponentRuntimeConfig API."
)


class Gauge(NamedTuple):
    """One inference component (``component``) or variant (None) as it runs now."""

    account: str
    region: str
    endpoint: str
    variant: str
    component: str | None
    size: int
    """Its copies, or the variant's instances."""
    outstanding: int
    """The invocations in flight on them."""
    serves_model: bool = True
    """False for a variant that hosts inference components (its instances hold copies)."""


class Router(Placements):
    def route(
        self,
        region: str | None,
        endpoint_name: str,
        target_variant: str | None = None,
        component: str | None = None,
        session_id: str | None = None,
    ) -> Route:
        """The container for an invocation, or RouteError saying why there is none. The chosen
        instance counts the invocation as outstanding until :meth:`finished`."""
        try:
            with self._counting:  # choosing and counting at once: two requests never see the same count
                route = self._route(region, endpoint_name, target_variant, component, session_id)
                if route.instance is not None:
                    route.instance.outstanding += 1
                    route.instance.invocations += 1
                sample = self._concurrency(route)
        except NoCapacity as exc:
            self.metrics.no_capacity(exc.account, exc.region, exc.component)
            raise
        if sample is not None:
            self.metrics.concurrency(route.account, route.region, *sample)
        return route

    def _concurrency(self, route: Route) -> tuple[str, tuple[tuple[str, str], ...], float] | None:
        """The requests in flight per copy of the routed component (per instance of the variant),
        this one included (called under ``_counting``)."""
        with self._lock:
            if route.component is not None:
                base = self._adapters.get((route.account, route.region, route.component))
                name = base.base if base is not None else route.component
                placed = self._components.get((route.account, route.region, name))
                group = placed.containers if placed is not None else []
                metric, dims = "ConcurrentRequestsPerCopy", component_dims(route.component)
            else:
                deployment = self._deployments.get((route.account, route.region, route.endpoint_name))
                group = list(deployment.containers.get(route.variant, [])) if deployment is not None else []
                metric, dims = "ConcurrentRequestsPerModel", endpoint_dims(route.endpoint_name, route.variant)
        if not group:
            return None
        return metric, dims, sum(c.outstanding for c in group) / len(group)

    def instances_report(self) -> list[dict[str, object]]:
        """Every endpoint instance with its routing counts (the runtime's ``GET /lmforge/instances``)."""
        with self._lock:
            deployments = list(self._deployments.values())
            sticky: dict[int, int] = {}
            for instance in self._sessions.values():
                sticky[id(instance)] = sticky.get(id(instance), 0) + 1
        return [
            {
                "endpoint": d.endpoint_name,
                "region": d.region,
                "variant": variant,
                "instance": i,
                "port": c.port,
                "alive": c.alive,
                "routing_strategy": d.routing.get(variant, RANDOM),
                "outstanding": c.outstanding,
                "invocations": c.invocations,
                "sessions": sticky.get(id(c), 0),
                "restarts": c.restarts,
            }
            for d in deployments
            for variant, group in sorted(d.containers.items())
            for i, c in enumerate(group)
        ]

    def components_report(self) -> list[dict[str, object]]:
        """Every copy of every inference component, with the instance it was placed on and its
        routing counts (the runtime's ``GET /lmforge/instances``, under ``components``)."""
        with self._lock:
            placed = [(k, p, list(p.copies)) for k, p in self._components.items()]
            hosts = {k: [h.name for h in v.hosts] for k, v in self._hosts.items()}
        rows: list[dict[str, object]] = []
        for (_, region, name), p, copies in sorted(placed, key=lambda x: x[0]):
            for i, copy in enumerate(copies):
                c = copy.container
                rows.append(
                    {
                        "endpoint": p.endpoint_name,
                        "region": region,
                        "variant": p.variant,
                        "component": name,
                        "copy": i,
                        "instance": copy.host.name,
                        "port": c.port,
                        "alive": c.alive,
                        "outstanding": c.outstanding,
                        "invocations": c.invocations,
                        "restarts": c.restarts,
                    }
                )
        for (_, region, endpoint, variant), names in sorted(hosts.items()):
            used = {r["instance"] for r in rows if r["endpoint"] == endpoint and r["variant"] == variant}
            rows += [
                {"endpoint": endpoint, "region": region, "variant": variant, "component": None, "instance": h}
                for h in names
                if h not in used
            ]
        return rows

    def metric_gauges(self) -> list[Gauge]:
        """What the runtime runs now, for the metrics read off it each period: every inference
        component (an adapter component with its base's copies) and every variant."""
        rows: list[Gauge] = []
        with self._counting, self._lock:
            for (account, region, name), p in self._components.items():
                rows.append(
                    Gauge(
                        account,
                        region,
                        p.endpoint_name,
                        p.variant,
                        name,
                        len(p.copies),
                        sum(c.container.outstanding for c in p.copies),
                    )
                )
            for (account, region, name), a in self._adapters.items():
                base = self._components.get((account, region, a.base))
                copies = base.copies if base is not None else []
                outstanding = sum(c.container.outstanding for c in copies)
                rows.append(
                    Gauge(account, region, a.endpoint_name, a.variant, name, len(copies), outstanding)
                )
            for (account, region, endpoint, variant), hosts in self._hosts.items():
                rows.append(Gauge(account, region, endpoint, variant, None, len(hosts.hosts), 0, False))
            for d in self._deployments.values():
                for variant, group in d.containers.items():
                    rows.append(
                        Gauge(
                            d.account,
                            d.region,
                            d.endpoint_name,
                            variant,
                            None,
                            len(group),
                            sum(c.outstanding for c in group),
                        )
                    )
        return rows

    def finished(self, route: Route) -> None:
        """An invocation sent along ``route`` has ended (answered, failed or abandoned)."""
        if route.instance is not None:
            with self._counting:
                route.instance.outstanding = max(0, route.instance.outstanding - 1)

    def session_opened(self, route: Route, session_id: str) -> None:
        """The instance behind ``route`` opened sticky session ``session_id``: route it there."""
        if route.instance is None:
            return
        with self._lock:
            self._sessions[(route.account, route.region, route.endpoint_name, session_id)] = route.instance
            while len(self._sessions) > MAX_SESSIONS:
                del self._sessions[next(iter(self._sessions))]

    def session_closed(self, route: Route, session_id: str) -> None:
        with self._lock:
            self._sessions.pop((route.account, route.region, route.endpoint_name, session_id), None)

    def _route(
        self,
        region: str | None,
        endpoint_name: str,
        target_variant: str | None,
        component: str | None,
        session_id: str | None,
    ) -> Route:
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
            raise RouteError(f"Endpoint {endpoint_name} of account {self.account} not found.")
        deployment = found[0]
        if component is not None and target_variant is not None:
            raise RouteError(
                "TargetVariant cannot be specified together with InferenceComponentName: an inference "
                "component is invoked on its own variant."
            )
        if component is not None and adapter and adapter[0][0].endpoint_name == endpoint_name:
            placement, base = adapter[0]
            if base is None:
                raise RouteError(
                    f"Inference component {component} is not in service on endpoint {endpoint_name} "
                    f"(its base inference component {placement.base} is not)."
                )
            if not base.copies:
                raise NoCapacity(NO_CAPACITY, deployment.account, deployment.region, component)
            instance = _pick(base.containers, deployment.routing.get(placement.variant, RANDOM))
            return Route(
                deployment.account,
                deployment.region,
                endpoint_name,
                deployment.endpoint_arn,
                placement.variant,
                instance.port,
                adapter=component,
                component=component,
                instance=instance,
            )
        if component is not None:
            if not placed or placed[0].endpoint_name != endpoint_name:
                raise RouteError(
                    f"Inference component {component} is not in service on endpoint {endpoint_name}."
                )
            p = placed[0]
            if not p.copies:
                raise NoCapacity(NO_CAPACITY, deployment.account, deployment.region, component)
            instance = _pick(p.containers, deployment.routing.get(p.variant, RANDOM))
            return Route(
                deployment.account,
                deployment.region,
                endpoint_name,
                deployment.endpoint_arn,
                p.variant,
                instance.port,
                component=component,
                instance=instance,
            )
        if not deployment.containers:
            raise RouteError(
                "Inference Component Name header is required for endpoints to which you plan to deploy "
                "inference components. Please include Inference Component Name header or consider using "
                "SageMaker models."
            )
        if target_variant is not None and target_variant not in deployment.containers:
            raise RouteError(f"Endpoint {endpoint_name} has no production variant {target_variant!r}.")
        sticky = self._session_instance(deployment.account, deployment.region, endpoint_name, session_id)
        if sticky is not None and target_variant in (None, sticky[0]):
            variant, instance = sticky
        else:
            if target_variant is not None:
                variant = target_variant
            else:
                live = sorted(v for v, group in deployment.containers.items() if any(c.alive for c in group))
                if live:
                    weights = [deployment.weights.get(n, 1.0) for n in live]
                    variant = random.choices(live, weights=weights if sum(weights) > 0 else None)[0]
                else:  # being restarted: the runtime reports it as a model error
                    variant = sorted(deployment.containers)[0]
            instance = _pick(deployment.containers[variant], deployment.routing.get(variant, RANDOM))
        return Route(
            deployment.account,
            deployment.region,
            endpoint_name,
            deployment.endpoint_arn,
            variant,
            instance.port,
            instance=instance,
        )

    def _session_instance(
        self, account: str, region: str, endpoint_name: str, session_id: str | None
    ) -> tuple[str, Container] | None:
        """The (variant, instance) holding a sticky session, while that instance is registered."""
        if not session_id:
            return None
        with self._lock:
            instance = self._sessions.get((account, region, endpoint_name, session_id))
            deployment = self._deployments.get((account, region, endpoint_name))
            if instance is None or deployment is None:
                return None
            for variant, group in deployment.containers.items():
                if any(c is instance for c in group):
                    return variant, instance
            del self._sessions[(account, region, endpoint_name, session_id)]  # its instance is gone
        return None

    def _known(self, region: str | None, endpoint_name: str) -> bool:
        from moto.sagemaker.models import sagemaker_backends

        for account in list(sagemaker_backends):
            for reg in list(sagemaker_backends[account]):
                if region is not None and reg != region:
                    continue
                if endpoint_name in sagemaker_backends[account][reg].endpoints:
                    return True
        return False


def _pick(group: Sequence[Container], strategy: str) -> Container:
    """One instance of a variant: among the live ones (all of them while none is), at random or the
    least busy."""
    live = [c for c in group if c.alive] or list(group)
    if strategy == LEAST_OUTSTANDING_REQUESTS:
        fewest = min(c.outstanding for c in live)
        live = [c for c in live if c.outstanding == fewest]
    return random.choice(live)
