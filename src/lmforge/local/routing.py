"""Routing an invocation to the container that serves it: a production variant (by
``TargetVariant`` or by weight among live ones), an inference component, or an adapter component
(its base component's container, with the adapter named in a header)."""

from __future__ import annotations

import random

from lmforge.local.placements import Placements, Route, RouteError


class Router(Placements):
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
            raise RouteError(f"Endpoint {endpoint_name} of account {self.account} not found.")
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
