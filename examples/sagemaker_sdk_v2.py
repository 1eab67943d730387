"""Deploy a model folder with the SageMaker Python SDK v2 (``sagemaker<3``) and stream from it.

The same deployment ``lmforge deploy`` makes, written the way SDK users already write it::

    model = sagemaker.Model(image_uri=..., model_data="s3://.../model.tar.gz", role=...)
    predictor = model.deploy(..., container_startup_health_check_timeout=...)
    for line in predictor.predict_stream(body, iterator=LineIterator): ...

It runs against real AWS, or against the local SageMaker with no code change::

    eval "$(lmforge local up --print-env)"
    python examples/sagemaker_sdk_v2.py MODEL_DIR --endpoint-name sdk-llm --instance-type ml.g5.2xlarge

lmforge is used only to validate and pack the folder and to name the default image.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--endpoint-name", required=True)
    parser.add_argument("--instance-type", default="ml.g5.2xlarge")
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

    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    import boto3
    import sagemaker
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.iterators import LineIterator
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import JSONSerializer

    from lmforge.artifacts import package_model
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
    session = sagemaker.Session(boto_session=boto_session, default_bucket=bucket)

    config = load_config(args.model_dir, env={}).config
    with tempfile.TemporaryDirectory() as tmp:
        packed = package_model(args.model_dir, Path(tmp) / "model.tar.gz")
        model_data = session.upload_data(
            str(packed.output), bucket=bucket, key_prefix=f"sdk/{args.endpoint_name}/{packed.sha256[:16]}"
        )
    print(f"uploaded {model_data}", file=sys.stderr)

    model = sagemaker.Model(
        image_uri=choose_image(args.image_uri, config, args.instance_type, region, account).uri,
        model_data=model_data,
        role=args.role,
        sagemaker_session=session,
        predictor_cls=Predictor,
    )
    predictor = model.deploy(
        initial_instance_count=1,
        instance_type=args.instance_type,
        endpoint_name=args.endpoint_name,
        container_startup_health_check_timeout=600,
        model_data_download_timeout=600,
        serializer=JSONSerializer(),
        deserializer=JSONDeserializer(),
        wait=False,
    )
    # deploy(wait=True) polls DescribeEndpoint every 30 s; every 5 s says "InService" sooner
    print(f"waiting for endpoint {args.endpoint_name} to be InService", file=sys.stderr)
    session.wait_for_endpoint(args.endpoint_name, poll=5)
    try:
        body = {"inputs": args.prompt, "parameters": {"max_new_tokens": args.max_new_tokens}}
        streamed = []
        for line in predictor.predict_stream({**body, "stream": True}, iterator=LineIterator):
            obj = json.loads(line)
            streamed.append(obj["token"]["text"])
            print(obj["token"]["text"], end="", flush=True)
        print()
        answer = predictor.predict(body)
        same = "".join(streamed) == answer["generated_text"]
        print(f"non-streamed generated_text matches the stream: {same}", file=sys.stderr)
    finally:
        if not args.keep:
            predictor.delete_endpoint(delete_endpoint_config=True)
            model.delete_model()
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
