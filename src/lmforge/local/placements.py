"""What the local SageMaker runs, and where: the registries the provisioner, the router, the
watchdog and the adapter components share (one lock), and the errors they raise."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from lmforge.local.containers import Container
from lmforge.local.metrics import Recorder


class ProvisionError(Exception):
    """A container that could not be started; the message becomes the FailureReason."""


class RouteError(Exception):
    """An invocation that cannot be routed; the runtime answers it as a ValidationError."""


class NoCapacity(RouteError):
    """An invocation of an inference component that has no copy (it counts in the component's
    ``NoCapacityInvocationFailures``)."""

    def __init__(self, message: str, account: str, region: str, component: str) -> None:
        super().__init__(message)
        self.account, self.region, self.component = account, region, component


#: the longest a container taken out of routing waits for its invocations before it is stopped
DRAIN_S = 60.0

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


@dataclass(frozen=True)
class Needs:
    """What one copy of an inference component reserves on an instance
    (``Specification.ComputeResourceRequirements``)."""

    cpus: float = 0.0
    memory_mb: float = 0.0
    accelerators: float = 0.0

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Needs:
        needs = spec.get("ComputeResourceRequirements") or {}
        return cls(
            float(needs.get("NumberOfCpuCoresRequired") or 0),
            float(needs.get("MinMemoryRequiredInMb") or 0),
            float(needs.get("NumberOfAcceleratorDevicesRequired") or 0),
        )


def instance_capacity(instance_type: object) -> Needs | None:
    """The cores, memory (MiB) and accelerators of an instance type (None when lmforge's table lacks it)."""
    from lmforge.deploy.instances import get_instance

    try:
        found = get_instance(str(instance_type))
    except ValueError:
        return None
    return Needs(float(found.vcpus), found.host_memory_gib * 1024, float(found.gpu_count))


@dataclass
class Host:
    """One instance of a variant that hosts inference components: its capacity (None: lmforge's
    instance table lacks the type, and nothing is limited) and what its copies reserve. Bookkeeping
    only: each copy is its own container."""

    name: str
    capacity: Needs | None
    reserved: list[Needs] = field(default_factory=list)

    def fits(self, needs: Needs) -> bool:
        if self.capacity is None:
            return True
        used = Needs(
            sum(n.cpus for n in self.reserved),
            sum(n.memory_mb for n in self.reserved),
            sum(n.accelerators for n in self.reserved),
        )
        return (
            used.cpus + needs.cpus <= self.capacity.cpus + 1e-9
            and used.memory_mb + needs.memory_mb <= self.capacity.memory_mb + 1e-9
            and used.accelerators + needs.accelerators <= self.capacity.accelerators + 1e-9
        )

    def release(self, needs: Needs) -> None:
        if needs in self.reserved:
            self.reserved.remove(needs)


@dataclass
class VariantHosts:
    """The instances of one production variant that hosts inference components, and how managed
    instance scaling may change their number (``ManagedInstanceScaling``)."""

    instance_type: str
    capacity: Needs | None
    hosts: list[Host]
    managed: bool = False
    min_count: int = 1
    max_count: int = 1
    started: int = 0
    """Instances started so far (names them)."""

    def add(self) -> Host:
        self.started += 1
        host = Host(f"{self.instance_type}-{self.started}", self.capacity)
        self.hosts.append(host)
        return host

    def place(self, needs: Needs) -> Host | None:
        """Reserve ``needs`` on the first instance with room, or on a new one where managed instance
        scaling allows it; None when the copy fits nowhere."""
        for host in self.hosts:
            if host.fits(needs):
                host.reserved.append(needs)
                return host
        if self.managed and len(self.hosts) < self.max_count:
            host = self.add()
            if host.fits(needs):
                host.reserved.append(needs)
                return host
            self.hosts.remove(host)
        return None

    def scale_in(self) -> list[Host]:
        """Managed instance scaling: the instances that hold no copy go, down to ``min_count``."""
        if not self.managed:
            return []
        gone = []
        for host in list(reversed(self.hosts)):
            if len(self.hosts) <= self.min_count:
                break
            if not host.reserved:
                self.hosts.remove(host)
                gone.append(host)
        return gone


@dataclass
class Copy:
    """One copy of an inference component: its container, on one of the variant's instances."""

    container: Container
    host: Host
    needs: Needs


@dataclass
class Placement:
    """The copies of one inference component (``generation``: of the specification they run)."""

    endpoint_name: str
    variant: str
    copies: list[Copy] = field(default_factory=list)
    generation: int = 0

    @property
    def containers(self) -> list[Container]:
        return [c.container for c in self.copies]


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
    component: str | None = None
    """The inference component invoked (an adapter component's own name), for its metrics."""
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
        self._hosts: dict[tuple[str, str, str, str], VariantHosts] = {}
        """(account, region, endpoint, variant) -> the instances of a variant for inference components."""
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._counting = threading.Lock()
        """Guards the instances' ``outstanding`` counts (taken before ``_lock``, never after)."""
        self._sessions: dict[tuple[str, str, str, str], Container] = {}
        """(account, region, endpoint, session id) -> the instance that opened the session."""
        self.metrics = Recorder()
        """What the runtime counts for SageMaker's invocation metrics (:mod:`lmforge.local.metrics`)."""

    def _run(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"lmforge-{name}", daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _stop_later(self, containers: list[Container]) -> None:
        """Stop ``containers`` (taken out of routing already) once the invocations routed to them
        have ended, so that none reaches a container that is shutting down (its server would answer
        503); at most :data:`DRAIN_S` later, at once when the local SageMaker stops."""
        for container in containers:
            container.stopping = True
            self._run(partial(self._stop_when_idle, container), f"stop-{container.label}")

    def _stop_when_idle(self, container: Container) -> None:
        deadline = time.monotonic() + DRAIN_S
        while not self._stopping.is_set() and time.monotonic() < deadline:
            with self._counting:  # the router chooses and counts under it: no invocation is in between
                if container.outstanding <= 0:
                    break
            self._stopping.wait(0.05)
        container.stop()
