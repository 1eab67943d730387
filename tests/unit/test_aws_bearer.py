"""SageMaker bearer tokens (the OpenAI-compatible path's API key): made as the SageMaker SDK makes
them, read back by the local SageMaker, refused when malformed or expired."""

from __future__ import annotations

import base64
import datetime as dt
from urllib.parse import parse_qs, urlsplit

import pytest
from botocore.credentials import Credentials

from lmforge.aws.bearer import PREFIX, BearerTokenError, bearer_token, read_bearer_token

CREDS = Credentials("AKIDEXAMPLE", "secret", "session-token")


def test_a_token_is_a_presigned_call_with_bearer_token_url() -> None:
    token = bearer_token("eu-west-1", credentials=CREDS, expires_s=600)
    assert token.startswith(PREFIX)
    signed = base64.b64decode(token[len(PREFIX) :]).decode()
    assert signed.startswith("sagemaker.amazonaws.com/?") and signed.endswith("&Version=1")
    query = parse_qs(urlsplit("https://" + signed).query)
    assert query["Action"] == ["CallWithBearerToken"] and query["X-Amz-Expires"] == ["600"]
    assert query["X-Amz-Credential"][0].endswith("/eu-west-1/sagemaker/aws4_request")
    assert query["X-Amz-Security-Token"] == ["session-token"]
    read = read_bearer_token(token)
    assert (read.region, read.access_key) == ("eu-west-1", "AKIDEXAMPLE")
    later = read.expires_at + dt.timedelta(seconds=1)
    with pytest.raises(BearerTokenError, match="expired"):
        read_bearer_token(token, now=later)
    with pytest.raises(ValueError, match="12 hours"):
        bearer_token("eu-west-1", credentials=CREDS, expires_s=13 * 3600)


@pytest.mark.parametrize(
    ("token", "words"),
    [
        ("sk-openai", PREFIX),
        (PREFIX + "!!!", "base64"),
        (
            PREFIX + base64.b64encode(b"bedrock.amazonaws.com/?Action=CallWithBearerToken").decode(),
            "signed for",
        ),
        (
            PREFIX
            + base64.b64encode(
                b"sagemaker.amazonaws.com/?Action=CallWithBearerToken&X-Amz-Credential=A%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
            ).decode(),
            "scope",
        ),
        (
            PREFIX
            + base64.b64encode(
                b"sagemaker.amazonaws.com/?Action=CallWithBearerToken&X-Amz-Credential=A%2F20260101%2Fus-east-1"
                b"%2Fsagemaker%2Faws4_request"
            ).decode(),
            "X-Amz-Date",
        ),
    ],
)
def test_malformed_tokens_are_refused_saying_why(token: str, words: str) -> None:
    with pytest.raises(BearerTokenError, match=words):
        read_bearer_token(token)
