"""Client helpers for reading lmforge / LMI streams, from a local server or a SageMaker endpoint."""

from lmforge.client.sagemaker import invoke, invoke_stream, runtime_client, token_text
from lmforge.client.stream import StreamError, iter_lines, iter_stream_objects

__all__ = [
    "StreamError",
    "invoke",
    "invoke_stream",
    "iter_lines",
    "iter_stream_objects",
    "runtime_client",
    "token_text",
]
