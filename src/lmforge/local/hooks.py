"""What the local control plane tells the runtime: an endpoint or inference component was created,
updated or deleted. The provisioner implements it; :mod:`lmforge.local.moto_ext` and
:mod:`lmforge.local.inference_components` call it from inside moto's request handling (the calls
must not block). :func:`install_hooks` names the implementation the patches call; lmforge keeps it
here, not on moto's classes."""

from __future__ import annotations

from typing import Any, Protocol


class EndpointHooks(Protocol):
    """What the control plane tells the runtime (the provisioner implements it)."""

    def endpoint_created(self, backend: Any, endpoint: Any) -> None: ...

    def endpoint_updating(self, backend: Any, endpoint: Any, endpoint_config_name: str) -> None: ...

    def endpoint_deleted(self, backend: Any, endpoint_name: str) -> None: ...

    def capacity_changing(self, backend: Any, endpoint: Any, desired: dict[str, dict[str, Any]]) -> None:
        """``UpdateEndpointWeightsAndCapacities``: variant name -> its ``DesiredWeight`` and/or
        ``DesiredInstanceCount``; the endpoint is ``Updating`` until the instances match."""

    def component_created(self, backend: Any, component: Any) -> None: ...

    def component_scaling(self, backend: Any, component: Any) -> None:
        """``UpdateInferenceComponentRuntimeConfig``: the component's copy count changed."""

    def component_deleted(self, backend: Any, component: Any) -> None: ...


class _Installed:
    """The hooks the patched moto calls, held by lmforge (not on moto's classes): the last installed."""

    hooks: EndpointHooks | None = None


def install_hooks(hooks: EndpointHooks) -> None:
    """Make ``hooks`` the ones the patched control plane calls from now on (the last given wins)."""
    _Installed.hooks = hooks


def installed_hooks() -> EndpointHooks:
    """The hooks :func:`install_hooks` was last given (the patches are installed only after that)."""
    hooks = _Installed.hooks
    if hooks is None:
        raise RuntimeError("lmforge's moto patches run before install_hooks gave them their hooks")
    return hooks
