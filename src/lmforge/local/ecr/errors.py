"""The registry the patched ECR backend serves from, and the ECR errors the patches raise."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from lmforge.local.registry import (
    LocalRegistry,
    RegistryError,
    find_registry_binary,
    missing_binary_message,
)


@functools.cache
def _error_class() -> type[Exception]:
    from moto.core.exceptions import ServiceException

    # defined here, not taken from moto.core: moto looks an error up by its module's service too
    class LocalEcrError(ServiceException):  # type: ignore[misc]
        pass

    return LocalEcrError


def service_error(code: str, message: str) -> Exception:
    """An ECR error of ``code`` (one of the ECR model's error shapes)."""
    return _error_class()(code, message)


def live(backend_cls: Any) -> LocalRegistry | None:
    """The registry :func:`~lmforge.local.ecr.install` gave ``backend_cls`` (None: moto's own calls)."""
    registry: LocalRegistry | None = backend_cls._lmforge_registry
    return registry


def not_running(backend_cls: Any) -> Exception:
    """The ``ServerException`` for a registry that is not running, saying why."""
    registry: LocalRegistry | None = backend_cls._lmforge_registry
    if registry is not None:
        why = f"it stopped (its log: {registry.log_path})"
    elif reason := backend_cls._lmforge_registry_reason:
        why = reason
    elif find_registry_binary() is None:
        why = missing_binary_message()
    else:
        why = "the local SageMaker was started without one"
    return service_error("ServerException", f"The local ECR registry is not running: {why}")


def registry_errors(backend_cls: Any, method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a registry that does not answer into a ServerException that says so."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except RegistryError as exc:
            registry = live(backend_cls)
            if registry is not None and not registry.running:
                raise not_running(backend_cls) from exc
            raise service_error("ServerException", f"The local ECR registry failed: {exc}") from exc

    call.__name__ = getattr(method, "__name__", "call")
    return call
