"""What the local SageMaker runs, and where: the registries the provisioner, the router, the
watchdog and the adapter components share (one lock), and the errors they raise."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.local.containers import Container


class ProvisionError(Exception):
    """A container that could not be started; the message becomes the FailureReason."""


class RouteError(Exception):
    """An invocation that cannot be routed; the runtime answers it as a ValidationError."""


#: SageMaker's routing strategies (``ProductionVariants[].RoutingConfig.RoutingStrategy``)
RANDOM = "RANDOM"
LEAST_OUTSTANDING_REQUESTS = "LEAST_OUTSTANDING_REQUESTS"
ROUTING_STRATEGIES = (LEAST_OUTSTANDING_REQUESTS, RANDOM)


@dataclass
class Deployment:
    """The running containers behind one endpoint configuration."""

    account: str
    region: str
    endpoint_name: str
    endpoint_arn: str
    config_name: str
    containers: dict[str, list[Container]]
    """Each production variant's instances (``InitialInstanceCount``, then its desired count)."""
    weights: dict[str, float] = field(default_factory=dict)
    routing: dict[str, str] = field(default_factory=dict)
    """Each variant's routing strategy (SageMaker's default: ``RANDOM``)."""

    def instances(self) -> list[Container]:
        return [c for group in self.containers.values() for c in group]


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
    instance: Container | None = field(default=None, compare=False)
    """The instance chosen (the runtime counts its outstanding requests and its sessions)."""


Key = tuple[str, str, str]
"""(account, region, name) of an endpoint or an inference component."""


class Placements:
    """The registries (guarded by ``_lock``) and the worker threads of the local SageMaker."""

    def __init__(self, account: str) -> None:
        self.account = account
        self._lock = threading.Lock()
        self._deployments: dict[Key, Deployment] = {}
        self._components: dict[Key, Placement] = {}
        self._adapters: dict[Key, AdapterPlacement] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._counting = threading.Lock()
        """Guards the instances' ``outstanding`` counts (taken before ``_lock``, never after)."""
        self._sessions: dict[tuple[str, str, str, str], Container] = {}
        """(account, region, endpoint, session id) -> the instance that opened the session."""

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
