"""``lmforge local up|down|status``: the local SageMaker."""

from __future__ import annotations

import os
from pathlib import Path

import click

_STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where its state, endpoints and logs live [default: $LMFORGE_LOCAL_DIR or ~/.lmforge/local].",
)


@click.group("local")
def local_group() -> None:
    """Run a local SageMaker (S3, the control plane and the runtime) that real boto3 clients talk to."""


@local_group.command("up")
@_STATE_DIR
@click.option("--print-env", is_flag=True, help="Print only the shell `export` lines (for eval).")
@click.option("--port", type=int, default=0, help="Control plane and S3 port [default: a free one].")
@click.option("--runtime-port", type=int, default=0, help="sagemaker-runtime port [default: a free one].")
@click.option(
    "--mode",
    type=click.Choice(["auto", "image", "process"]),
    default=lambda: os.environ.get("LMFORGE_LOCAL_MODE", "auto"),
    show_default="auto ($LMFORGE_LOCAL_MODE)",
    help="How endpoint instances run: image (the Model's image, with podman or docker), process "
    "(lmforge's server as a host process; lmforge's images only), auto (image when an engine answers).",
)
@click.option("--engine", type=click.Choice(["auto", "podman", "docker"]), help="For --mode image.")
def up_command(
    state_dir: Path | None, print_env: bool, port: int, runtime_port: int, mode: str, engine: str | None
) -> None:
    """Start the local SageMaker in the background (or find the running one): S3, the SageMaker
    control plane, ECR with a real registry, and the runtime.

    Point your shell at it with:  eval "$(lmforge local up --print-env)"
    """
    from lmforge.local import control

    directory = control.state_dir(state_dir)
    try:
        state, started = control.up(directory, port=port, runtime_port=runtime_port, mode=mode, engine=engine)
    except control.LocalError as exc:
        raise click.ClickException(str(exc)) from None
    if not started and mode != "auto" and state.mode != mode:
        click.echo(
            f"warning: the running local SageMaker is in {state.mode} mode, not {mode}; "
            f"`lmforge local down{_dir_flag(state_dir)}` first to change it",
            err=True,
        )
    if print_env:
        click.echo(state.export_lines(), nl=False)
        return
    verb = "started" if started else "already running"
    click.echo(f"local SageMaker {verb} (pid {state.pid}, state in {state.state_dir})")
    click.echo(f"  control plane and S3: {state.control_url}")
    click.echo(f"  runtime:              {state.runtime_url}")
    click.echo(f"  ECR registry:         {state.registry_url or 'not running (see local.log)'}")
    click.echo(f"  instances run as:     {_mode_words(state)}")
    click.echo("")
    click.echo("Next: point boto3, the AWS CLI and the SageMaker SDK at it, then deploy:")
    click.echo(f'  eval "$(lmforge local up --print-env{_dir_flag(state_dir)})"')
    if state.mode == "image":
        click.echo("  lmforge deploy MODEL_DIR --endpoint-name my-llm --instance-type ml.m5.xlarge \\")
        click.echo("      --build-image")
        click.echo("  (builds lmforge's cpu image and pushes it to this local ECR when it is not there yet)")
    else:
        click.echo("  lmforge deploy MODEL_DIR --endpoint-name my-llm --instance-type ml.m5.xlarge")
    click.echo(f"Stop it with: lmforge local down{_dir_flag(state_dir)}")


@local_group.command("down")
@_STATE_DIR
def down_command(state_dir: Path | None) -> None:
    """Stop the local SageMaker and every endpoint it runs."""
    from lmforge.local import control

    directory = control.state_dir(state_dir)
    if control.down(directory):
        click.echo(f"local SageMaker stopped ({directory})")
    else:
        click.echo(f"no local SageMaker is running ({directory})")


@local_group.command("status")
@_STATE_DIR
def status_command(state_dir: Path | None) -> None:
    """Say whether the local SageMaker runs, and where."""
    from lmforge.local import control

    directory = control.state_dir(state_dir)
    state = control.read_state(directory)
    if state is None:
        click.echo(f"not running ({directory}); start it with: lmforge local up")
        raise SystemExit(1)
    click.echo(f"running (pid {state.pid}): control plane {state.control_url}, runtime {state.runtime_url}")
    click.echo(f"ECR registry: {state.registry_url or 'not running'}")
    click.echo(f"mode: {_mode_words(state)}")
    found = control.instances(directory)
    if not found:
        click.echo("no endpoint instances")
    else:
        click.echo("instances:")
    for item in found:
        where = item.get("container") or f"pid {item.get('pid')}"
        click.echo(
            f"  {item['endpoint']}/{item.get('label')}: {item.get('mode')} mode, "
            f"image {item.get('image') or '-'}, port {item.get('port')}, {where}"
        )
    _component_placements(state.runtime_url)


def _component_placements(runtime_url: str) -> None:
    """The instances of the variants that host inference components, and the copies on each (from the
    runtime's ``GET /lmforge/instances``)."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(runtime_url + "/lmforge/instances", timeout=10) as resp:
            rows = json.loads(resp.read()).get("components", [])
    except (OSError, ValueError):
        return
    if not rows:
        return
    click.echo("inference components (instance: copies):")
    by_instance: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    for row in rows:
        key = (str(row["endpoint"]), str(row["variant"]), str(row["instance"]))
        by_instance.setdefault(key, [])
        if row.get("component") is not None:
            by_instance[key].append(row)
    for (endpoint, variant, instance), placed in sorted(by_instance.items()):
        copies = ", ".join(
            f"{r['component']}#{r['copy']} (port {r['port']}, {r['invocations']} invocations"
            f"{'' if r['alive'] else ', restarting'})"
            for r in placed
        )
        click.echo(f"  {endpoint}/{variant} {instance}: {copies or 'no copy'}")


def _dir_flag(state_dir: Path | None) -> str:
    return f" --state-dir {state_dir}" if state_dir is not None else ""


def _mode_words(state: object) -> str:
    mode = getattr(state, "mode", "process")
    if mode == "image":
        return f"images ({getattr(state, 'engine', None) or 'container engine'})"
    return "host processes (process mode: lmforge's server stands in for lmforge's images only)"
