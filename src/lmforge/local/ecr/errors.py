"""The registry the patched ECR backend serves from (held here, by lmforge, not on moto's classes),
and the ECR errors the patches raise."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass
class Serving:
    """What the patched ECR serves from: ``registry`` (None: moto's own image calls) and, without one,
    ``reason`` (why there is none, for ``GetAuthorizationToken``'s error)."""

    registry: LocalRegistry | None = None
    reason: str | None = None


#: the one the patches read; :func:`serve` replaces it (the last install wins)
_SERVING = Serving()


def serve(registry: LocalRegistry | None, reason: str | None) -> None:
    """Serve the patched ECR from ``registry`` from now on (``reason``: why there is none)."""
    global _SERVING
    _SERVING = Serving(registry, reason)


def moto_errors() -> Any:
    """moto's ECR exceptions module (``ImageNotFoundException`` & co.)."""
    from moto.ecr import exceptions

    return exceptions


def live() -> LocalRegistry | None:
    """The registry :func:`~lmforge.local.ecr.install` gave (None: moto's own calls)."""
    return _SERVING.registry


def not_running() -> Exception:
    """The ``ServerException`` for a registry that is not running, saying why."""
    registry, reason = _SERVING.registry, _SERVING.reason
    if registry is not None:
        why = f"it stopped (its log: {registry.log_path})"
    elif reason:
        why = reason
    elif find_registry_binary() is None:
        why = missing_binary_message()
    else:
        why = "the local SageMaker was started without one"
    return service_error("ServerException", f"The local ECR registry is not running: {why}")


def registry_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, with a registry that does not answer turned into a ServerException that says so."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except RegistryError as exc:
            registry = live()
            if registry is not None and not registry.running:
                raise not_running() from exc
            raise service_error("ServerException", f"The local ECR registry failed: {exc}") from exc

    return call
