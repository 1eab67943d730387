"""Stream a completion from a SageMaker endpoint with plain boto3.

Works unchanged against real SageMaker and against the local one (``lmforge local up``), because
boto3 takes its endpoint URLs from the environment::

    python examples/stream_boto3.py ENDPOINT_NAME "def fibonacci(n):"

``iter_stream_objects`` reassembles JSON lines that SageMaker may split across ``PayloadPart``
events (or pack several into one); it is the only lmforge piece used here.
"""

from __future__ import annotations

import json
import sys

import boto3

from lmforge.client import iter_stream_objects


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    endpoint = sys.argv[1]
    prompt = sys.argv[2] if len(sys.argv) > 2 else "def fibonacci(n):"
    runtime = boto3.client("sagemaker-runtime")
    response = runtime.invoke_endpoint_with_response_stream(
        EndpointName=endpoint,
        ContentType="application/json",
        Body=json.dumps(
            {"inputs": prompt, "parameters": {"max_new_tokens": 48, "details": True}, "stream": True}
        ),
    )
    details = None
    print(prompt, end="", flush=True)
    for obj in iter_stream_objects(response["Body"]):
        print(obj["token"]["text"], end="", flush=True)
        details = obj.get("details") or details
    print()
    if details:
        print(
            f"[finish_reason={details['finish_reason']}, generated_tokens={details['generated_tokens']}, "
            f"variant={response['InvokedProductionVariant']}]",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
