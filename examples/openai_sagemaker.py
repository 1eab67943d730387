"""Chat with a SageMaker endpoint through SageMaker's OpenAI-compatible path, with the official
``openai`` client and a SageMaker bearer token.

Works against real SageMaker and against the local one (``eval "$(lmforge local up --print-env)"``):
the runtime's URL comes from ``AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME`` when it is set::

    python examples/openai_sagemaker.py ENDPOINT_NAME "Write a haiku about tea."
    python examples/openai_sagemaker.py ENDPOINT_NAME --component IC_NAME "Hello"   # an inference component

The token is the one the SageMaker SDK's ``generate_token`` makes (``lmforge.aws.bearer`` makes the
same from boto3's credentials); the caller needs ``sagemaker:CallWithBearerToken`` and
``sagemaker:InvokeEndpoint``. ``model`` is sent empty: SageMaker routes by the URL.
"""

from __future__ import annotations

import argparse
import os
import sys

import boto3
from openai import OpenAI

from lmforge.aws.bearer import bearer_token


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("endpoint")
    parser.add_argument("prompt", nargs="?", default="Write a haiku about tea.")
    parser.add_argument("--component", help="an inference component on the endpoint")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_intermixed_args()
    region = boto3.session.Session().region_name or "us-west-2"
    runtime = os.environ.get(
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", f"https://runtime.sagemaker.{region}.amazonaws.com"
    )
    path = f"/endpoints/{args.endpoint}" + (
        f"/inference-components/{args.component}" if args.component else ""
    )
    client = OpenAI(base_url=f"{runtime.rstrip('/')}{path}/openai/v1", api_key=bearer_token(region))
    stream = client.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": args.prompt}],
        max_tokens=args.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    print(f"user: {args.prompt}\nassistant: ", end="", flush=True)
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
        elif chunk.usage is not None:
            print(f"\n[{chunk.usage.completion_tokens} tokens]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
