"""Deploy a model folder with the SageMaker Python SDK v3 (``sagemaker>=3``: sagemaker-core and
sagemaker-serve) and stream from it.

The same deployment ``lmforge deploy`` makes, written the way SDK v3 users write it::

    builder = ModelBuilder(image_uri=..., s3_model_data_url="s3://.../model.tar.gz", role_arn=...,
                           model_server=ModelServer.DJL_SERVING, sagemaker_session=session)
    builder.build()                       # CreateModel, after validating the role with IAM
    endpoint = builder.deploy(endpoint_name=..., instance_type=..., wait=False, ...)
    endpoint.wait_for_status("InService")
    for obj in iter_stream_objects(runtime.invoke_endpoint_with_response_stream(...)): ...

``--api resources`` makes it with sagemaker-core's resources instead (``Model.create``,
``EndpointConfig.create``, ``Endpoint.create``). It runs against real AWS, or against the local
SageMaker with no code change::

    eval "$(lmforge local up --print-env)"
    python examples/sagemaker_sdk_v3.py MODEL_DIR --endpoint-name sdk3-llm --instance-type ml.g5.2xlarge

What SDK v3 does that no endpoint setting redirects, and the one-line workaround used below:

- ``Session.default_bucket()`` asks STS for the account at ``https://sts.REGION.amazonaws.com``,
  whatever ``AWS_ENDPOINT_URL`` says: give the bucket, ``Session(boto_session=..., default_bucket=B)``.
- ``Endpoint.invoke_with_response_stream`` fails on every endpoint, real ones included
  (``'EventStream' object has no attribute 'get'``, sagemaker-core <= 2.27): stream with boto3's
  ``sagemaker-runtime`` client of the same session; lmforge's reader takes its response as it is.
- ``ModelBuilder(model="s3://...")`` looks the string up as a JumpStart model id: pass the
  archive as ``s3_model_data_url=``.
- ``deploy(wait=True)`` polls every 30 s: ``deploy(wait=False)``, then ``wait_for_status(poll=5)``.

lmforge is used only to validate and pack the folder, to name the default image and to read the stream.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--endpoint-name", required=True)
    parser.add_argument("--instance-type", default="ml.g5.2xlarge")
    parser.add_argument("--api", choices=("model-builder", "resources"), default="model-builder")
    parser.add_argument(
        "--role", default=os.environ.get("LMFORGE_ROLE_ARN"), help="[default: $LMFORGE_ROLE_ARN]"
    )
    parser.add_argument("--bucket", help="[default: sagemaker-REGION-ACCOUNT]")
    parser.add_argument(
        "--image-uri",
        help="[default: lmforge's image for the backend in the account's ECR, as lmforge deploy picks]",
    )
    parser.add_argument("--prompt", default="def fibonacci(n):")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--keep", action="store_true", help="Leave the endpoint running.")
    args = parser.parse_args(argv)
    if not args.role:
        parser.error("--role (or LMFORGE_ROLE_ARN) is required")

    import boto3
    from sagemaker.core.helper.session_helper import Session

    from lmforge.artifacts import package_model
    from lmforge.client import iter_stream_objects
    from lmforge.config import load_config
    from lmforge.deploy.images import choose_image
    from lmforge.deploy.upload import ensure_bucket

    boto_session = boto3.Session()
    region = boto_session.region_name
    if not region:
        parser.error("no AWS region: set AWS_DEFAULT_REGION")
    account = boto_session.client("sts").get_caller_identity()["Account"]
    bucket = args.bucket or f"sagemaker-{region}-{account}"
    ensure_bucket(boto_session.client("s3"), bucket, region)
    # An explicit default_bucket: the SDK would otherwise ask STS at a hard-coded regional URL.
    session = Session(boto_session=boto_session, default_bucket=bucket)

    config = load_config(args.model_dir, env={}).config
    with tempfile.TemporaryDirectory() as tmp:
        packed = package_model(args.model_dir, Path(tmp) / "model.tar.gz")
        model_data = session.upload_data(
            str(packed.output), bucket=bucket, key_prefix=f"sdk3/{args.endpoint_name}/{packed.sha256[:16]}"
        )
    print(f"uploaded {model_data}", file=sys.stderr)
    image_uri = choose_image(args.image_uri, config, args.instance_type, region, account).uri

    deploy = _deploy_with_model_builder if args.api == "model-builder" else _deploy_with_resources
    endpoint, cleanup = deploy(args, session, image_uri, model_data)
    # deploy(wait=True) polls DescribeEndpoint every 30 s; every 5 s says "InService" sooner
    print(f"waiting for endpoint {args.endpoint_name} to be InService", file=sys.stderr)
    endpoint.wait_for_status("InService", poll=5)
    try:
        body = {"inputs": args.prompt, "parameters": {"max_new_tokens": args.max_new_tokens}}
        runtime = boto_session.client("sagemaker-runtime")
        response = runtime.invoke_endpoint_with_response_stream(
            EndpointName=args.endpoint_name,
            Body=json.dumps({**body, "stream": True}),
            ContentType="application/json",
        )
        streamed = []
        for obj in iter_stream_objects(response):
            streamed.append(obj["token"]["text"])
            print(obj["token"]["text"], end="", flush=True)
        print()
        answer = json.loads(
            endpoint.invoke(body=json.dumps(body), content_type="application/json").body.read()
        )
        same = "".join(streamed) == answer["generated_text"]
        print(f"non-streamed generated_text matches the stream: {same}", file=sys.stderr)
    finally:
        if not args.keep:
            cleanup()
    return 0 if same else 1


def _deploy_with_model_builder(
    args: argparse.Namespace, session: Any, image_uri: str, model_data: str
) -> tuple[Any, Any]:
    from sagemaker.core.resources import EndpointConfig
    from sagemaker.serve import ModelBuilder
    from sagemaker.serve.utils.types import ModelServer

    builder = ModelBuilder(
        s3_model_data_url=model_data,  # not model=: a string there is looked up as a JumpStart id
        image_uri=image_uri,
        model_server=ModelServer.DJL_SERVING,
        role_arn=args.role,
        sagemaker_session=session,
        instance_type=args.instance_type,
    )
    model = builder.build()  # validates the role (iam:SimulatePrincipalPolicy, iam:GetRole), then CreateModel
    print(f"model {model.model_name} created", file=sys.stderr)
    endpoint = builder.deploy(
        endpoint_name=args.endpoint_name,
        initial_instance_count=1,
        instance_type=args.instance_type,
        container_startup_health_check_timeout=600,
        model_data_download_timeout=600,
        wait=False,
    )

    def cleanup() -> None:
        endpoint.delete()
        EndpointConfig.get(endpoint.endpoint_config_name, session=session.boto_session).delete()
        model.delete()

    return endpoint, cleanup


def _deploy_with_resources(
    args: argparse.Namespace, session: Any, image_uri: str, model_data: str
) -> tuple[Any, Any]:
    from sagemaker.core.resources import Endpoint, EndpointConfig, Model
    from sagemaker.core.shapes import ContainerDefinition, ProductionVariant

    boto_session = session.boto_session
    model = Model.create(
        model_name=args.endpoint_name,
        primary_container=ContainerDefinition(image=image_uri, model_data_url=model_data),
        execution_role_arn=args.role,
        session=boto_session,
    )
    config = EndpointConfig.create(
        endpoint_config_name=args.endpoint_name,
        production_variants=[
            ProductionVariant(
                variant_name="AllTraffic",
                model_name=model.model_name,
                initial_instance_count=1,
                instance_type=args.instance_type,
                container_startup_health_check_timeout_in_seconds=600,
                model_data_download_timeout_in_seconds=600,
            )
        ],
        session=boto_session,
    )
    endpoint = Endpoint.create(
        endpoint_name=args.endpoint_name,
        endpoint_config_name=config.endpoint_config_name,
        session=boto_session,
    )

    def cleanup() -> None:
        endpoint.delete()
        config.delete()
        model.delete()

    return endpoint, cleanup


if __name__ == "__main__":
    raise SystemExit(main())
