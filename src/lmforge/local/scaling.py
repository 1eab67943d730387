"""Scaling a production variant's instances, as ``UpdateEndpointWeightsAndCapacities`` asks (the call
Application Auto Scaling makes for a ``sagemaker:variant:DesiredInstanceCount`` target): new
instances start and pass ``/ping`` before they get traffic; removed ones stop after their requests
(SIGTERM: the server drains). The endpoint is ``Updating`` meanwhile, then ``InService`` with the
counts it reached (and a ``FailureReason`` when an instance could not start)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from lmforge.local.containers import Container
from lmforge.local.placements import Placements

log = logging.getLogger("lmforge.local")


class Scaling(Placements):
    _start_variant: Callable[..., None]
    """The provisioner's: start N instances of a variant (see ``Provisioner._start_variant``)."""

    def capacity_changing(self, backend: Any, endpoint: Any, desired: dict[str, dict[str, Any]]) -> None:
        self._run(lambda: self._scale(backend, endpoint, desired), f"scale-{endpoint.endpoint_name}")

    def _scale(self, backend: Any, endpoint: Any, desired: dict[str, dict[str, Any]]) -> None:
        key = (backend.account_id, backend.region_name, endpoint.endpoint_name)
        with self._lock:
            deployment = self._deployments.get(key)
        errors: list[str] = []
        if deployment is not None:
            config = backend.describe_endpoint_config(deployment.config_name)
            specs = {v["VariantName"]: v for v in config["ProductionVariants"]}
            for name, change in desired.items():
                if change.get("DesiredWeight") is not None:
                    deployment.weights[name] = float(change["DesiredWeight"])
                count = change.get("DesiredInstanceCount")
                group = deployment.containers.get(name)
                if count is None or group is None or name not in specs:
                    continue
                count = int(count)
                if count > len(group):
                    started: dict[str, list[Container]] = {}
                    self._start_variant(
                        backend, endpoint.endpoint_name, specs[name], started, errors, count - len(group)
                    )
                    with self._lock:
                        still = self._deployments.get(key) is deployment and not self._stopping.is_set()
                        if still:
                            group.extend(started.get(name, []))
                    if not still:
                        self._stop_later(started.get(name, []))
                elif count < len(group):
                    with self._lock:
                        # the idlest go first; what they still serve ends before they stop
                        group.sort(key=lambda c: c.outstanding, reverse=True)
                        removed = group[count:]
                        del group[count:]
                    self._stop_later(removed)
                log.info("endpoint %s variant %s: %d instances", endpoint.endpoint_name, name, len(group))
        for variant in endpoint.production_variants:
            name = variant["VariantName"]
            if deployment is not None and name in deployment.containers:
                variant["CurrentInstanceCount"] = len(deployment.containers[name])
            if "DesiredWeight" in variant:
                variant["CurrentWeight"] = variant["DesiredWeight"]
        endpoint.failure_reason = " ".join(errors)[:1024] or None
        if backend.endpoints.get(endpoint.endpoint_name) is endpoint:
            endpoint.endpoint_status = "InService"
