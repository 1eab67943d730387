"""Which model serves a request: the base model or one registered LoRA adapter, resolved once from
every place a client may name it (SageMaker's adapter headers, LMI's ``adapters``, OpenAI's
``model``, ``?adapter=``), and the name OpenAI answers give it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmforge.errors import BadRequestError, NotFoundError

if TYPE_CHECKING:
    from lmforge.adapters.registry import AdapterRegistry
    from lmforge.adapters.spec import LoraAdapter
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import Engine
    from lmforge.handlers.io import Input
    from lmforge.handlers.request_common import ParsedRequest

ADAPTER_HEADER = "x-amzn-sagemaker-adapter-identifier"
ALIAS_HEADER = "x-amzn-sagemaker-adapter-alias"
ADAPTER_QUERY = "adapter"


@dataclass(frozen=True, slots=True)
class Served:
    """What serves one request."""

    adapter: LoraAdapter | None
    """The adapter to apply, None for the base model."""
    model_name: str
    """The name OpenAI answers give as ``model``: the adapter's, else the model's."""


class ServedModels:
    """The base model (by any of its names) and the registered adapters (``adapters``; None when
    option.enable_lora is off)."""

    def __init__(self, config: ServingConfig, engine: Engine, adapters: AdapterRegistry | None) -> None:
        self._config = config
        self._engine = engine
        self._adapters = adapters

    def names(self) -> set[str]:
        """Names an OpenAI ``model`` may give for the base model (``/v1/models``'s name, ``model``,
        ``option.model_id``, the folder's name; or none). Others: an adapter, else vLLM's 404 on /v1."""
        names = {"model", self._engine.model_name}
        if self._config.model_id:
            names.add(self._config.model_id)
        if self._config.model_dir is not None:
            names.add(self._config.model_dir.name)
        return names

    def check(self, named: str | None) -> None:
        """An OpenAI ``model`` must name the served model or a registered adapter (vLLM's 404)."""
        if not named or named in self.names():
            return
        if self._adapters is None or self._adapters.find(named) is None:
            raise self._unknown(named)

    def _unknown(self, named: str) -> NotFoundError:
        """vLLM's 404 for a ``model`` that is neither the served model nor a registered adapter."""
        names = ", ".join(sorted(self.names()))
        adapters = [a.name for a in self._adapters.all()] if self._adapters is not None else []
        also = f"; adapters: {', '.join(adapters[:20])}" if adapters else ""
        return NotFoundError(
            f"The model `{named}` does not exist. Valid aliases: {names}{also}.", param="model"
        )

    def resolve(self, req: ParsedRequest, inputs: Input) -> Served:
        """What serves ``req``, sent as ``inputs`` (on an OpenAI route: an unknown ``model`` is a 404)."""
        adapter = self._adapter(req, inputs)
        return Served(adapter, adapter.name if adapter is not None else self._engine.model_name)

    def _adapter(self, req: ParsedRequest, inputs: Input) -> LoraAdapter | None:
        """The adapter a request asks for: header (SageMaker's identifier, else its alias), body
        (``adapters``) or ``?adapter=``."""
        identifier = inputs.get_property(ADAPTER_HEADER)
        alias = inputs.get_property(ALIAS_HEADER)
        if not identifier and alias:
            found = self._adapters.find_alias(alias) if self._adapters is not None else None
            identifier = found.name if found is not None else alias
        wanted = {
            source: value
            for source, value in (
                ("the X-Amzn-SageMaker-Adapter-Identifier or -Alias header", identifier),
                ("adapters", req.adapter),
                ("model", req.model),
                ("the adapter query parameter", inputs.get_query(ADAPTER_QUERY)),
            )
            if value
        }
        if "model" in wanted:
            named = wanted["model"]
            if req.openai_route:  # vLLM's 404 for a name it does not serve
                self.check(named)
            if named in self.names():
                del wanted["model"]  # the OpenAI model field names the served model, not an adapter
            elif self._adapters is None:  # /invocations: SageMaker routes by endpoint, and its
                del wanted["model"]  # clients send any model name
        if not wanted:
            return None
        if len(set(wanted.values())) > 1:
            raise BadRequestError(
                "the request names different adapters: "
                + ", ".join(f"{v!r} in {k}" for k, v in wanted.items()),
                param="adapters",
            )
        name = next(iter(wanted.values()))
        if self._adapters is None:
            raise BadRequestError(
                f"adapter {name!r} requested but LoRA adapters are not enabled (option.enable_lora=true)",
                param="adapters",
            )
        return self._adapters.get(name)

    def models(self, created: int) -> dict[str, Any]:
        """``GET /v1/models``: the served model, then each registered adapter (its parent: the model)."""
        base = self._engine.model_name

        def entry(name: str, **parent: str) -> dict[str, Any]:
            return {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "lmforge",
                "root": name,
                **parent,
            }

        adapters = self._adapters.all() if self._adapters is not None else []
        return {"object": "list", "data": [entry(base), *(entry(a.name, parent=base) for a in adapters)]}
