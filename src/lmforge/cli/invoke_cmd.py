"""``lmforge invoke ENDPOINT [PROMPT] --stream``: call a SageMaker endpoint and print the answer."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click


def _payload(
    prompt: str | None,
    body: str | None,
    parameters: str | None,
    max_new_tokens: int | None,
    details: bool,
    chat: bool,
) -> dict[str, Any]:
    if body is not None:
        text = Path(body[1:]).read_text() if body.startswith("@") else body
        try:
            payload = json.loads(text)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--body") from None
        if not isinstance(payload, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--body")
        return payload
    if prompt is None:
        raise click.UsageError("give a PROMPT (or - to read it from stdin), or a --body")
    if prompt == "-":
        prompt = sys.stdin.read()
    params: dict[str, Any] = {}
    if parameters:
        try:
            params = json.loads(parameters)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--parameters") from None
    if max_new_tokens is not None:
        params["max_new_tokens"] = max_new_tokens
    if details:
        params["details"] = True
    if chat:
        return {"messages": [{"role": "user", "content": prompt}], **params}
    return {"inputs": prompt, "parameters": params}


@click.command("invoke")
@click.argument("endpoint_name")
@click.argument("prompt", required=False)
@click.option("--stream/--no-stream", default=False, help="Print tokens as they are generated.")
@click.option("--details", is_flag=True, help="Ask for generation details and print them (stderr).")
@click.option("--max-new-tokens", type=click.IntRange(1), help="parameters.max_new_tokens")
@click.option("--parameters", help="More generation parameters as JSON, e.g. '{\"temperature\": 0.7}'.")
@click.option("--chat", is_flag=True, help="Send PROMPT as one user message (chat `messages`).")
@click.option("--body", help="The whole request body as JSON, or @FILE.")
@click.option("--custom-attributes", help="X-Amzn-SageMaker-Custom-Attributes")
@click.option("--inference-component", help="InferenceComponentName")
@click.option("--region")
def invoke_command(
    endpoint_name: str,
    prompt: str | None,
    stream: bool,
    details: bool,
    max_new_tokens: int | None,
    parameters: str | None,
    chat: bool,
    body: str | None,
    custom_attributes: str | None,
    inference_component: str | None,
    region: str | None,
) -> None:
    """Send PROMPT to ENDPOINT_NAME; with --stream, through invoke_endpoint_with_response_stream."""
    from botocore.exceptions import BotoCoreError, ClientError

    from lmforge.client import invoke, invoke_stream, runtime_client, token_text

    payload = _payload(prompt, body, parameters, max_new_tokens, details, chat)
    client = runtime_client(region)
    try:
        if not stream:
            answer = invoke(
                endpoint_name,
                payload,
                client=client,
                custom_attributes=custom_attributes,
                inference_component=inference_component,
            )
            if not isinstance(answer, dict) or "generated_text" not in answer:
                click.echo(json.dumps(answer, indent=2))  # not LMI's schema (e.g. chat): print it whole
                return
            click.echo(answer["generated_text"])
            if details and answer.get("details") is not None:
                click.echo(json.dumps(answer["details"], indent=2), err=True)
            return
        final: dict[str, Any] | None = None
        for obj in invoke_stream(
            endpoint_name,
            payload,
            client=client,
            custom_attributes=custom_attributes,
            inference_component=inference_component,
        ):
            if obj.get("error") is not None:
                click.echo("", err=False)
                error = obj["error"]
                message = error.get("message") if isinstance(error, dict) else error
                raise click.ClickException(f"the endpoint stopped the stream: {message}")
            click.echo(token_text(obj), nl=False)
            sys.stdout.flush()
            if obj.get("details") or obj.get("generated_text") is not None:
                final = obj
        click.echo("")
        if details and final is not None:
            click.echo(json.dumps(final.get("details"), indent=2), err=True)
    except (ClientError, BotoCoreError) as exc:
        raise click.ClickException(str(exc)) from None
