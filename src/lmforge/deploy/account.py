"""The AWS a deployment talks to: the region, the account, the default bucket, and which SageMaker that
is in words (real AWS, or the local SageMaker of ``lmforge local up``)."""

from __future__ import annotations

import os

from lmforge.deploy.settings import DeployUsageError


def resolve_region(explicit: str | None) -> str:
    """``explicit``, else the AWS SDK's region; DeployUsageError when there is none."""
    import boto3

    region = explicit or boto3.session.Session().region_name
    if not region:
        raise DeployUsageError("no AWS region: pass --region or set AWS_DEFAULT_REGION")
    return str(region)


def account_id(region: str) -> str:
    """The AWS account of the credentials boto3 finds (STS GetCallerIdentity)."""
    import boto3

    return str(boto3.client("sts", region_name=region).get_caller_identity()["Account"])


def default_bucket(region: str) -> str:
    """``sagemaker-REGION-ACCOUNT``, the SageMaker SDK's default bucket naming."""
    return f"sagemaker-{region}-{account_id(region)}"


def where() -> str:
    """Which SageMaker boto3 will talk to, in words."""
    url = os.environ.get("AWS_ENDPOINT_URL_SAGEMAKER") or os.environ.get("AWS_ENDPOINT_URL")
    if url and url.startswith(("http://127.", "http://localhost")):
        return f"the local SageMaker at {url}"
    if url:
        return f"the SageMaker API at {url}"
    return "AWS SageMaker"
