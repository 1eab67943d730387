"""``lmforge adapter add|list|remove``: LoRA adapters on a running server or a SageMaker endpoint.

Against a server (``--url``), the commands call its adapters API (``POST /adapters``, ``GET``,
``DELETE /adapters/NAME``, or the ``/models/MODEL/adapters`` form with ``--model``); SRC is read by
the server: a folder under its allowed roots or an allowed ``s3://`` prefix.

Against an endpoint (``--endpoint``), an adapter is a SageMaker adapter inference component on a base
inference component (``Specification.BaseInferenceComponentName`` + ``Container.ArtifactUrl``). SRC is
an ``s3://`` location, or a local adapter folder that is checked here (PEFT files, safetensors only),
packed and uploaded content-addressed first. Works against AWS or the local SageMaker alike.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from lmforge.cli.progress import note

TARGETS = "give --url URL (a running lmforge or LMI server) or --endpoint NAME (a SageMaker endpoint)"
SETTLED = frozenset({"InService", "Failed"})


def _target(url: str | None, endpoint: str | None) -> str:
    if bool(url) == bool(endpoint):
        raise click.UsageError(TARGETS)
    return "url" if url else "endpoint"


# ----------------------------------------------------------------------------- server (--url)
def _server(url: str, model: str | None) -> Any:
    """The adapters API client of ``url`` (LMI's /models/MODEL form with ``model``)."""
    from lmforge.client.adapters import AdaptersClient

    try:
        return AdaptersClient(url, model=model)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--url") from None


def _api(call: Any) -> Any:
    """Run one adapters API call; its refusal as a one-line ClickException."""
    from lmforge.client.adapters import AdaptersApiError

    try:
        return call()
    except AdaptersApiError as exc:
        raise click.ClickException(exc.message) from None


# ----------------------------------------------------------------------------- endpoint (--endpoint)
def _describe(sm: Any, name: str) -> dict[str, Any] | None:
    from botocore.exceptions import ClientError

    try:
        return dict(sm.describe_inference_component(InferenceComponentName=name))
    except ClientError as exc:
        if "Could not find" in str(exc):
            return None
        raise


def _check_folder(folder: Path) -> None:
    """The checks the server repeats on registration that need no base model: PEFT files,
    safetensors only, a LoRA config (the rank against the server's limit is checked there)."""
    from lmforge.adapters.validate import AdapterError, check_files, read_config

    try:
        check_files(folder, folder)
        read_config(folder, max_rank=1 << 30)
    except AdapterError as exc:
        raise click.ClickException(f"{folder}: {exc.message}") from None


def _upload_folder(folder: Path, target: str, region: str) -> str:
    """Pack ``folder`` and upload it content-addressed under ``target``; the object's s3:// URI."""
    from lmforge.artifacts import package_model
    from lmforge.cli.progress import progress_bar
    from lmforge.deploy.upload import ensure_bucket, s3_client, split_s3_uri, upload_archive

    s3 = s3_client(region)
    bucket, _ = split_s3_uri(target)
    if ensure_bucket(s3, bucket, region):
        note(f"created bucket s3://{bucket}")
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "adapter.tar.gz"
        packaged = package_model(folder, archive, validate=False)
        size = archive.stat().st_size
        with progress_bar("upload", size) as advance:
            result = upload_archive(archive, packaged.sha256, target, s3=s3, progress=advance)
    sent = "already there, nothing sent" if result.sent_bytes == 0 else f"{size / 1024:.0f} KB sent"
    note(f"{result.uri} ({sent})")
    return result.uri


def _wait(sm: Any, name: str, timeout_s: float, *, gone: bool = False) -> dict[str, Any] | None:
    """Poll until ``name`` settles (or, with ``gone``, no longer exists), echoing each status."""
    started = time.monotonic()
    last = None
    while True:
        desc = _describe(sm, name)
        status = "deleted" if desc is None else desc["InferenceComponentStatus"]
        elapsed = time.monotonic() - started
        if status != last:
            note(f"  [{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {name}: {status}")
            last = status
        if desc is None or (not gone and status in SETTLED):
            return desc
        if elapsed > timeout_s:
            raise click.ClickException(f"{name} is still {status} after {elapsed:.0f} s")
        time.sleep(min(5.0, 0.5 + elapsed / 10))


def _is_adapter(desc: dict[str, Any]) -> bool:
    return bool((desc.get("Specification") or {}).get("BaseInferenceComponentName"))


def _aws(exc: Exception) -> Exception:
    from lmforge.cli.common import aws_error

    return aws_error(exc)


# ----------------------------------------------------------------------------- commands
URL = click.option("--url", help="A running server, e.g. http://127.0.0.1:8080.")
MODEL = click.option("--model", help="With --url: use /models/MODEL/adapters (LMI's form).")
ENDPOINT = click.option("--endpoint", help="A SageMaker endpoint with inference components.")
REGION = click.option("--region", help="[default: the AWS SDK's region]")
TIMEOUT = click.option(
    "--timeout", type=click.IntRange(1), default=900, show_default=True, help="Seconds to wait."
)
JSON_OUT = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group("adapter")
def adapter_group() -> None:
    """LoRA adapters on a running server (--url) or a SageMaker endpoint (--endpoint)."""


@adapter_group.command("add")
@click.argument("name")
@click.argument("src")
@URL
@MODEL
@click.option("--preload/--no-preload", default=True, show_default=True, help="With --url.")
@click.option("--pin", is_flag=True, help="With --url: keep it loaded (never evicted).")
@ENDPOINT
@click.option("--base-component", help="With --endpoint: the base inference component (the model).")
@click.option("--bucket", help="With a local SRC: bucket [default: sagemaker-REGION-ACCOUNT].")
@click.option("--s3-prefix", default="lmforge/adapters", show_default=True, help="With a local SRC.")
@REGION
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for InService.")
@TIMEOUT
def add_command(
    name: str,
    src: str,
    url: str | None,
    model: str | None,
    preload: bool,
    pin: bool,
    endpoint: str | None,
    base_component: str | None,
    bucket: str | None,
    s3_prefix: str,
    region: str | None,
    wait: bool,
    timeout: int,
) -> None:
    """Register adapter NAME from SRC.

    \b
    --url:      SRC is read by the server (a folder under its adapter roots, or an allowed s3:// prefix).
    --endpoint: creates (or updates) the adapter inference component NAME on --base-component; SRC is
                an s3:// location (adapter .tar.gz or prefix) or a local adapter folder, uploaded first.
    """
    if _target(url, endpoint) == "url":
        assert url is not None
        if base_component:
            raise click.UsageError("--base-component goes with --endpoint")
        client = _server(url, model)
        answer = _api(lambda: client.register(name, src, preload=preload, pin=pin))
        adapter = answer.get("adapter") or {}
        click.echo(f"{name}: registered from {adapter.get('src', src)} (rank {adapter.get('rank', '?')})")
        return
    assert endpoint is not None
    if not base_component:
        raise click.UsageError("--endpoint needs --base-component (the inference component of the model)")
    from lmforge.aws.names import name_problem

    if problem := name_problem("inferenceComponentName", name):
        raise click.BadParameter(problem, param_hint="NAME")
    try:
        _add_component(name, src, endpoint, base_component, bucket, s3_prefix, region, wait, timeout)
    except click.ClickException:
        raise
    except Exception as exc:
        raise _aws(exc) from None


def _add_component(
    name: str,
    src: str,
    endpoint: str,
    base_component: str,
    bucket: str | None,
    s3_prefix: str,
    region: str | None,
    wait: bool,
    timeout: int,
) -> None:
    from lmforge.cli.common import default_bucket, region_or_fail
    from lmforge.deploy.endpoints import sagemaker_client

    region = region_or_fail(region)
    sm = sagemaker_client(region)
    base = _describe(sm, base_component)
    if base is None:
        raise click.ClickException(f"inference component {base_component} does not exist")
    if _is_adapter(base):
        raise click.ClickException(f"{base_component} is itself an adapter inference component")
    if base["EndpointName"] != endpoint:
        raise click.ClickException(f"{base_component} is on endpoint {base['EndpointName']}, not {endpoint}")
    if src.startswith("s3://"):
        artifact = src
    else:
        folder = Path(src).expanduser()
        if not folder.is_dir():
            raise click.BadParameter(f"{src!r} is neither an s3:// location nor a folder", param_hint="SRC")
        _check_folder(folder)
        target = f"s3://{bucket or default_bucket(region)}/{s3_prefix.strip('/')}/{name}"
        artifact = _upload_folder(folder, target, region)
    spec = {"BaseInferenceComponentName": base_component, "Container": {"ArtifactUrl": artifact}}
    existing = _describe(sm, name)
    if existing is None:
        sm.create_inference_component(
            InferenceComponentName=name,
            EndpointName=endpoint,
            VariantName=base["VariantName"],
            Specification=spec,
        )
        verb = "created"
    else:
        if (existing.get("Specification") or {}).get("BaseInferenceComponentName") != base_component:
            raise click.ClickException(
                f"inference component {name} exists and is not an adapter of {base_component}; "
                "choose another NAME"
            )
        sm.update_inference_component(InferenceComponentName=name, Specification=spec)
        verb = "updated"
    note(f"{name}: {verb} on {endpoint} (base {base_component}, {artifact})")
    if not wait:
        click.echo(f"{name}: {verb}, not waiting")
        return
    desc = _wait(sm, name, timeout)
    assert desc is not None
    if desc["InferenceComponentStatus"] == "Failed":
        raise click.ClickException(f"{name} Failed: {desc.get('FailureReason', 'no reason given')}")
    if verb == "updated" and desc.get("FailureReason"):
        raise click.ClickException(
            f"{name}: the update failed, the previous adapter keeps serving: {desc['FailureReason']}"
        )
    click.echo(f"{name}: InService ({verb})")
    note(f'Next: lmforge invoke {endpoint} "PROMPT" --inference-component {name}')


@adapter_group.command("list")
@URL
@MODEL
@ENDPOINT
@REGION
@JSON_OUT
def list_command(
    url: str | None, model: str | None, endpoint: str | None, region: str | None, as_json: bool
) -> None:
    """The adapters of a server (--url), or the adapter inference components of an endpoint."""
    rows: list[dict[str, Any]]
    if _target(url, endpoint) == "url":
        assert url is not None
        client = _server(url, model)
        rows = _api(client.list)
        columns = ("name", "rank", "pin", "src")
    else:
        assert endpoint is not None
        try:
            rows = _list_components(endpoint, region)
        except click.ClickException:
            raise
        except Exception as exc:
            raise _aws(exc) from None
        columns = ("name", "base", "status", "artifact")
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        note(f"no adapters on {url or endpoint}")
        return
    table = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for r in table:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def _cell(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _list_components(endpoint: str, region: str | None) -> list[dict[str, Any]]:
    from lmforge.cli.common import region_or_fail
    from lmforge.deploy.endpoints import sagemaker_client

    sm = sagemaker_client(region_or_fail(region))
    rows = []
    kwargs: dict[str, Any] = {"EndpointNameEquals": endpoint, "SortOrder": "Ascending"}
    while True:
        page = sm.list_inference_components(**kwargs)
        for summary in page.get("InferenceComponents", []):
            desc = _describe(sm, summary["InferenceComponentName"])
            if desc is None or not _is_adapter(desc):
                continue
            spec = desc["Specification"]
            row = {
                "name": desc["InferenceComponentName"],
                "base": spec["BaseInferenceComponentName"],
                "status": desc["InferenceComponentStatus"],
                "artifact": (spec.get("Container") or {}).get("ArtifactUrl", ""),
            }
            if desc.get("FailureReason"):
                row["failure_reason"] = desc["FailureReason"]
            rows.append(row)
        if not page.get("NextToken"):
            return rows
        kwargs["NextToken"] = page["NextToken"]


@adapter_group.command("remove")
@click.argument("name")
@URL
@MODEL
@ENDPOINT
@REGION
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until it is gone.")
@TIMEOUT
def remove_command(
    name: str,
    url: str | None,
    model: str | None,
    endpoint: str | None,
    region: str | None,
    wait: bool,
    timeout: int,
) -> None:
    """Deregister adapter NAME (--url), or delete the adapter inference component NAME (--endpoint)."""
    if _target(url, endpoint) == "url":
        assert url is not None
        client = _server(url, model)
        _api(lambda: client.remove(name))
        click.echo(f"{name}: removed")
        return
    assert endpoint is not None
    from lmforge.cli.common import region_or_fail
    from lmforge.deploy.endpoints import sagemaker_client

    try:
        sm = sagemaker_client(region_or_fail(region))
        desc = _describe(sm, name)
        if desc is None or desc["EndpointName"] != endpoint:
            raise click.ClickException(f"endpoint {endpoint} has no inference component {name}")
        if not _is_adapter(desc):
            raise click.ClickException(
                f"{name} is not an adapter inference component (it hosts a model); `lmforge adapter remove` "
                "deletes adapters only"
            )
        sm.delete_inference_component(InferenceComponentName=name)
        if wait:
            _wait(sm, name, timeout, gone=True)
    except click.ClickException:
        raise
    except Exception as exc:
        raise _aws(exc) from None
    click.echo(f"{name}: {'deleted' if wait else 'deleting'}")
