"""The adapter management API, in LMI's form and SageMaker's.

LMI (djl-serving's adapters API; the ``/models/{model}`` prefix may be left out with one model):

* ``POST   /models/{model}/adapters?name=NAME&src=SRC[&preload=true][&pin=false]`` register
* ``GET    /models/{model}/adapters[?limit=N&next_page_token=T]``              list
* ``GET    /models/{model}/adapters/{name}``                                    describe
* ``POST   /models/{model}/adapters/{name}/update?[src=..][&preload=..][&pin=..]`` update
* ``DELETE /models/{model}/adapters/{name}``                                    remove

SageMaker's form is the same without the prefix: ``POST /adapters`` and ``DELETE /adapters/{name}``
(``PUT /adapters/{name}`` updates). Parameters come from the query string or a JSON body (body wins
nothing: a parameter given both ways must agree). The ``X-Amzn-SageMaker-Adapter-Alias`` header is
kept as the adapter's alias.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

from lmforge.adapters.registry import LORA_DISABLED, check_name
from lmforge.errors import BadRequestError, MethodNotAllowedError, NotFoundError

if TYPE_CHECKING:
    from lmforge.adapters.registry import AdapterRegistry
    from lmforge.adapters.spec import LoraAdapter

ALIAS_HEADER = "x-amzn-sagemaker-adapter-alias"
MAX_PAGE = 1000
_REGISTER_KEYS = {"name", "src", "preload", "pin"}


def is_adapter_path(path: str) -> bool:
    parts = path.strip("/").split("/")
    return parts[0] == "adapters" or (len(parts) >= 3 and parts[0] == "models" and parts[2] == "adapters")


def _bool(params: dict[str, Any], key: str, default: bool) -> bool:
    value = params.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BadRequestError(f"{key} must be true or false, got {value!r}", param=key)


def _params(query: bytes, body: bytes, allowed: set[str]) -> dict[str, Any]:
    params: dict[str, Any] = dict(parse_qsl(query.decode("latin-1")))
    if body.strip():
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadRequestError(f"the body must be a JSON object: {exc}", param="body") from None
        if not isinstance(data, dict):
            raise BadRequestError("the body must be a JSON object", param="body")
        for key, value in data.items():
            if key in params and str(params[key]).lower() != str(value).lower():
                raise BadRequestError(f"{key} differs between the query and the body", param=key)
            params[key] = value
    unknown = sorted(set(params) - allowed - {"limit", "next_page_token"})
    if unknown:
        raise BadRequestError(
            f"unknown parameter(s) {', '.join(unknown)}; use {', '.join(sorted(allowed))}", param=unknown[0]
        )
    return params


def _describe(adapter: LoraAdapter) -> dict[str, Any]:
    out = adapter.describe()
    out.setdefault("preload", True)
    out.setdefault("pin", False)
    return out


async def handle(
    registry: AdapterRegistry | None,
    model_names: set[str],
    method: str,
    path: str,
    query: bytes,
    body: bytes,
    headers: dict[str, str],
) -> tuple[int, dict[str, Any]]:
    """Route one adapter-API call; returns (status, JSON body). Raises LmforgeError for failures."""
    parts = [unquote(p) for p in path.strip("/").split("/")]
    if parts[0] == "models":
        if parts[1] not in model_names:
            raise NotFoundError(
                f"model {parts[1]!r} is not served here (served: {', '.join(sorted(model_names))})",
                param="model",
            )
        parts = parts[2:]
    rest = parts[1:]  # after "adapters"
    if registry is None:
        raise BadRequestError(LORA_DISABLED, param="option.enable_lora")
    if not rest:
        if method == "GET":
            return 200, _list(registry, _params(query, b"", set()))
        if method == "POST":
            return await _register(registry, _params(query, body, _REGISTER_KEYS), headers)
        raise MethodNotAllowedError(f"method {method} is not allowed on /adapters; use GET or POST")
    name = check_name(rest[0])
    if len(rest) == 2 and rest[1] == "update":
        if method != "POST":
            raise MethodNotAllowedError(f"method {method} is not allowed here; use POST")
        return await _update(registry, name, _params(query, body, {"src", "preload", "pin"}), headers)
    if len(rest) > 1:
        raise NotFoundError(f"no route {method} {path}", param="path")
    if method == "GET":
        return 200, _describe(registry.get(name))
    if method == "PUT":
        return await _update(registry, name, _params(query, body, {"src", "preload", "pin"}), headers)
    if method == "DELETE":
        await registry.remove(name)
        return 200, {"message": f"Adapter {name} deregistered"}
    raise MethodNotAllowedError(f"method {method} is not allowed on /adapters/{name}; use GET, PUT or DELETE")


def _list(registry: AdapterRegistry, params: dict[str, Any]) -> dict[str, Any]:
    try:
        limit = int(params.get("limit", 100))
        token = int(params.get("next_page_token", 0))
    except ValueError:
        raise BadRequestError("limit and next_page_token must be integers", param="limit") from None
    if not 1 <= limit <= MAX_PAGE or token < 0:
        raise BadRequestError(f"limit must be 1-{MAX_PAGE} and next_page_token >= 0", param="limit")
    items, nxt = registry.page(limit, token)
    out: dict[str, Any] = {"adapters": [_describe(a) for a in items]}
    if nxt is not None:
        out["nextPageToken"] = str(nxt)
    return out


def _options(params: dict[str, Any], headers: dict[str, str], base: dict[str, Any]) -> dict[str, Any]:
    preload = _bool(params, "preload", bool(base.get("preload", True)))
    pin = _bool(params, "pin", bool(base.get("pin", False)))
    if pin and not preload:
        raise BadRequestError("pin=true needs preload=true", param="pin")
    options: dict[str, Any] = {"preload": preload, "pin": pin}
    alias = headers.get(ALIAS_HEADER) or base.get("alias")
    if alias:
        options["alias"] = alias
    return options


async def _register(
    registry: AdapterRegistry, params: dict[str, Any], headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    name = params.get("name")
    if name is None:
        raise BadRequestError("name is required (the adapter's name)", param="name")
    src = params.get("src")
    if not isinstance(src, str) or not src:
        raise BadRequestError("src is required: the adapter's folder or s3:// prefix", param="src")
    adapter = await registry.register(check_name(name), src, _options(params, headers, {}))
    return 200, {"message": f"Adapter {adapter.name} registered", "adapter": _describe(adapter)}


async def _update(
    registry: AdapterRegistry, name: str, params: dict[str, Any], headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    current = registry.get(name)
    src = params.get("src")
    if src is not None and not isinstance(src, str):
        raise BadRequestError("src must be a string", param="src")
    adapter = await registry.update(name, src, _options(params, headers, current.options))
    return 200, {"message": f"Adapter {adapter.name} updated", "adapter": _describe(adapter)}
