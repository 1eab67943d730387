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
from typing import Any

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


def _body(payload: Mapping[str, Any] | bytes | str) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode("utf-8")
    return json.dumps(payload).encode("utf-8")


def _optional(**kwargs: str | None) -> dict[str, str]:
    return {k: v for k, v in kwargs.items() if v is not None}


def invoke_stream(
    endpoint_name: str,
    payload: Mapping[str, Any] | bytes | str,
    *,
    client: Any = None,
    content_type: str = "application/json",
    accept: str | None = None,
    custom_attributes: str | None = None,
    inference_component: str | None = None,
    target_variant: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Stream ``payload`` through ``invoke_endpoint_with_response_stream``; yields each JSON line.

    A dict payload without ``"stream"`` gets ``"stream": true`` (LMI streams only when asked).
    """
    if isinstance(payload, Mapping) and "stream" not in payload:
        payload = {**payload, "stream": True}
    client = client or runtime_client()
    response = client.invoke_endpoint_with_response_stream(
        EndpointName=endpoint_name,
        Body=_body(payload),
        ContentType=content_type,
        **_optional(
            Accept=accept,
            CustomAttributes=custom_attributes,
            InferenceComponentName=inference_component,
            TargetVariant=target_variant,
        ),
    )
    yield from iter_stream_objects(response["Body"])


def invoke(
    endpoint_name: str,
    payload: Mapping[str, Any] | bytes | str,
    *,
    client: Any = None,
    content_type: str = "application/json",
    accept: str | None = None,
    custom_attributes: str | None = None,
    inference_component: str | None = None,
    target_variant: str | None = None,
) -> Any:
    """One ``invoke_endpoint`` call; returns the decoded JSON answer."""
    client = client or runtime_client()
    response = client.invoke_endpoint(
        EndpointName=endpoint_name,
        Body=_body(payload),
        ContentType=content_type,
        **_optional(
            Accept=accept,
            CustomAttributes=custom_attributes,
            InferenceComponentName=inference_component,
            TargetVariant=target_variant,
        ),
    )
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
