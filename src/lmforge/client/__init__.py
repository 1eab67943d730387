"""Client helpers for reading lmforge / LMI streams, from a local server or a SageMaker endpoint."""

from lmforge.client.stream import iter_lines, iter_stream_objects

__all__ = ["iter_lines", "iter_stream_objects"]
