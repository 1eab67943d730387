"""Invoke a SageMaker endpoint that runs lmforge or LMI, streaming or not::

    from lmforge.client import invoke_stream

    for obj in invoke_stream("my-llm", {"inputs": "def ", "parameters": {"max_new_tokens": 64}}):
        print(obj["token"]["text"], end="", flush=True)

Each object is one line of the endpoint's jsonlines (or SSE) stream, reassembled across
``PayloadPart`` boundaries. A mid-stream ``ModelStreamError`` raises botocore's ``EventStreamError``;
an error line the server sends in-band (``"error"`` in the object) is yielded like any other line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, TypedDict, Unpack

from lmforge.client.stream import iter_stream_objects


def runtime_client(region: str | None = None) -> Any:
    """A ``sagemaker-runtime`` client with a read timeout long enough for generation."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sagemaker-runtime",
        region_name=region,
        config=Config(read_timeout=70, retries={"max_attempts": 3, "mode": "standard"}),
    )


Payload = Mapping[str, Any] | bytes | str


def _body(payload: Payload) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode("utf-8")
    return json.dumps(payload).encode("utf-8")


class InvokeOptions(TypedDict, total=False):
    """Keyword options of :func:`invoke` and :func:`invoke_stream` (boto3's names in brackets)."""

    client: Any
    """A ``sagemaker-runtime`` client [default: :func:`runtime_client`]."""
    content_type: str | None
    """[ContentType] default ``application/json``."""
    accept: str | None
    """[Accept] e.g. ``text/event-stream`` for SSE."""
    custom_attributes: str | None
    """[CustomAttributes]"""
    inference_component: str | None
    """[InferenceComponentName]"""
    target_variant: str | None
    """[TargetVariant]"""


_BOTO_NAMES = {
    "accept": "Accept",
    "custom_attributes": "CustomAttributes",
    "inference_component": "InferenceComponentName",
    "target_variant": "TargetVariant",
}


def _call(operation: str, endpoint_name: str, payload: Payload, options: InvokeOptions) -> Any:
    client = options.get("client") or runtime_client()
    extra = {boto: options[key] for key, boto in _BOTO_NAMES.items() if options.get(key) is not None}  # type: ignore[literal-required]
    return getattr(client, operation)(
        EndpointName=endpoint_name,
        Body=_body(payload),
        ContentType=options.get("content_type") or "application/json",
        **extra,
    )


def invoke_stream(
    endpoint_name: str, payload: Payload, **options: Unpack[InvokeOptions]
) -> Iterator[dict[str, Any]]:
    """Stream ``payload`` through ``invoke_endpoint_with_response_stream``; yields each JSON line.

    A dict payload without ``"stream"`` gets ``"stream": true`` (LMI streams only when asked).
    """
    if isinstance(payload, Mapping) and "stream" not in payload:
        payload = {**payload, "stream": True}
    response = _call("invoke_endpoint_with_response_stream", endpoint_name, payload, options)
    yield from iter_stream_objects(response["Body"])


def invoke(endpoint_name: str, payload: Payload, **options: Unpack[InvokeOptions]) -> Any:
    """One ``invoke_endpoint`` call; returns the decoded JSON answer."""
    response = _call("invoke_endpoint", endpoint_name, payload, options)
    return json.loads(response["Body"].read())


def token_text(obj: Mapping[str, Any]) -> str:
    """The new text in one streamed object: LMI/TGI ``token.text`` or OpenAI chat ``delta.content``."""
    token = obj.get("token")
    if isinstance(token, Mapping):
        return str(token.get("text") or "")
    choices = obj.get("choices")
    if isinstance(choices, list) and choices:
        delta = choices[0].get("delta") or {}
        return str(delta.get("content") or "")
    return ""
