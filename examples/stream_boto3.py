"""Stream a completion from a SageMaker endpoint with plain boto3.

Works unchanged against real SageMaker and against the local one (``lmforge local up``), because
boto3 takes its endpoint URLs from the environment::

    python examples/stream_boto3.py ENDPOINT_NAME "def fibonacci(n):"        # LMI text completion
    python examples/stream_boto3.py ENDPOINT_NAME --chat "Write a haiku about tea."   # chat messages

A completion sends LMI's ``{"inputs", "parameters", "stream": true}`` and prints each line's
``token.text``; ``--chat`` sends ``{"messages", "max_tokens", "stream": true}`` (the model's chat
template renders them) and prints each chunk's ``choices[0].delta.content``. Both are greedy.
``iter_stream_objects`` reassembles JSON lines that SageMaker may split across ``PayloadPart``
events (or pack several into one); it is the only lmforge piece used here.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import boto3

from lmforge.client import iter_stream_objects


def _body(prompt: str, chat: bool, max_tokens: int) -> dict[str, Any]:
    if chat:
        return {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    params = {"max_new_tokens": max_tokens, "details": True}
    return {"inputs": prompt, "parameters": params, "stream": True}


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("endpoint")
    parser.add_argument("prompt", nargs="?", default="def fibonacci(n):")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a chat user message")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_intermixed_args()
    runtime = boto3.client("sagemaker-runtime")
    response = runtime.invoke_endpoint_with_response_stream(
        EndpointName=args.endpoint,
        ContentType="application/json",
        Body=json.dumps(_body(args.prompt, args.chat, args.max_tokens)),
    )
    finish, count = None, 0
    if args.chat:
        print(f"user: {args.prompt}\nassistant: ", end="", flush=True)
    else:
        print(args.prompt, end="", flush=True)
    for obj in iter_stream_objects(response["Body"]):
        if obj.get("error") is not None:  # a failure after the stream started: its last line
            error = obj["error"]
            print(f"\n[the endpoint stopped the stream: {error.get('message', error)}]", file=sys.stderr)
            return 1
        if args.chat:
            choice = obj["choices"][0]
            print(choice["delta"].get("content") or "", end="", flush=True)
            finish = choice.get("finish_reason") or finish
        else:
            print(obj["token"]["text"], end="", flush=True)
            if obj.get("details"):
                finish = obj["details"]["finish_reason"]
        count += 1
    print()
    print(
        f"[{count} streamed chunks, finish_reason={finish}, variant={response['InvokedProductionVariant']}]",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
