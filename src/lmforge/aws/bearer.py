"""SageMaker's bearer tokens, for the OpenAI-compatible invocation path
(``https://runtime.sagemaker.<region>.amazonaws.com/endpoints/<name>/openai/v1``).

A token is made on the client, with no call to AWS (the SageMaker Python SDK's
``sagemaker.core.token_generator.generate_token`` does the same): a SigV4 *query-signed* URL for
``POST https://sagemaker.amazonaws.com/?Action=CallWithBearerToken``, signing service ``sagemaker``
in the token's region, valid for up to 12 hours; its text without ``https://``, plus ``&Version=1``,
base64-encoded and prefixed ``sagemaker-api-key-``. The client sends it as ``Authorization: Bearer
<token>`` (the official ``openai`` client's ``api_key``).

:func:`bearer_token` makes one from boto3's credentials; :func:`read_bearer_token` is how the local
SageMaker reads one (the region it is scoped to, the access key, when it expires). The local
SageMaker does not check signatures, as it does not check SigV4 signatures elsewhere.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "sagemaker-api-key-"
SIGNING_HOST = "sagemaker.amazonaws.com"
ACTION = "CallWithBearerToken"
MAX_EXPIRY_S = 12 * 3600


class BearerTokenError(ValueError):
    """The token is not a SageMaker bearer token, or it has expired; the message says which."""


@dataclass(frozen=True)
class BearerToken:
    region: str
    access_key: str
    expires_at: dt.datetime


def bearer_token(region: str, *, expires_s: int = MAX_EXPIRY_S, credentials: Any = None) -> str:
    """A SageMaker bearer token for ``region`` from ``credentials`` (default: boto3's chain)."""
    from botocore.auth import SigV4QueryAuth
    from botocore.awsrequest import AWSRequest

    if not 1 <= expires_s <= MAX_EXPIRY_S:
        raise ValueError(f"expires_s must be between 1 and {MAX_EXPIRY_S} (12 hours), got {expires_s}")
    if credentials is None:
        import boto3

        credentials = boto3.session.Session().get_credentials()
        if credentials is None:
            raise BearerTokenError("no AWS credentials found to sign the token with")
    request = AWSRequest(
        method="POST",
        url=f"https://{SIGNING_HOST}/",
        headers={"host": SIGNING_HOST},
        params={"Action": ACTION},
    )
    SigV4QueryAuth(credentials, "sagemaker", region, expires=expires_s).add_auth(request)
    signed = request.url.removeprefix("https://") + "&Version=1"
    return PREFIX + base64.b64encode(signed.encode()).decode()


def read_bearer_token(token: str, now: dt.datetime | None = None) -> BearerToken:
    """The region, access key and expiry of a bearer token; BearerTokenError when it is malformed
    or expired."""
    if not token.startswith(PREFIX):
        raise BearerTokenError(f"the bearer token does not start with {PREFIX!r}")
    try:
        signed = base64.b64decode(token[len(PREFIX) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise BearerTokenError("the bearer token is not base64 of a signed URL") from None
    url = urlsplit("https://" + signed)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if url.hostname != SIGNING_HOST or query.get("Action") != ACTION:
        raise BearerTokenError(f"the bearer token is not signed for {ACTION} on {SIGNING_HOST}")
    scope = query.get("X-Amz-Credential", "").split("/")
    if len(scope) != 5 or scope[3] != "sagemaker" or scope[4] != "aws4_request":
        raise BearerTokenError("the bearer token's credential scope is not sagemaker's")
    try:
        signed_at = dt.datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        lifetime = int(query["X-Amz-Expires"])
    except (KeyError, ValueError):
        raise BearerTokenError("the bearer token has no valid X-Amz-Date and X-Amz-Expires") from None
    expires_at = signed_at + dt.timedelta(seconds=min(lifetime, MAX_EXPIRY_S))
    if (now or dt.datetime.now(dt.UTC)) >= expires_at:
        raise BearerTokenError(f"the bearer token expired at {expires_at:%Y-%m-%dT%H:%M:%SZ}")
    return BearerToken(region=scope[2], access_key=scope[0], expires_at=expires_at)
