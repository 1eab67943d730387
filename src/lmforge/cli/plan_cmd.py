"""``lmforge plan DIR --instance-type TYPE``: will the model fit, and which timeouts to deploy with.

Exit status: 0 when the plan fits, 1 when it does not, 2 for an invalid configuration, an unknown
instance type or a missing ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("plan")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--instance-type", required=True, help="SageMaker instance type, for example ml.g5.2xlarge.")
@click.option(
    "--model-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The model's Hugging Face config.json, when the weights are not in MODEL_DIR.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (the hint goes to stderr).")
def plan_command(model_dir: Path, instance_type: str, model_config: Path | None, as_json: bool) -> None:
    """Check that MODEL_DIR's configuration fits INSTANCE_TYPE's memory, and suggest start-up timeouts."""
    from lmforge.config import ConfigError, load_config
    from lmforge.deploy.plan import PlanError, make_plan, render_plan

    try:
        resolved = load_config(model_dir, env={})
    except ConfigError as exc:
        click.echo(f"error: invalid configuration:\n{exc}", err=True)
        raise SystemExit(2) from None
    try:
        plan = make_plan(model_dir, resolved.config, instance_type, model_config_path=model_config)
    except PlanError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    except ValueError as exc:  # an unknown instance type
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None

    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        click.echo(render_plan(plan))
        click.echo("")
    if plan.fits:
        hint = f"Next: lmforge deploy {model_dir} --endpoint-name NAME --instance-type {plan.instance_type}"
    elif plan.problems:
        hint = "Next: fix the problems above, then run lmforge plan again"
    else:
        hint = "Next: apply one of the suggestions above (in serving.properties), then run lmforge plan again"
    click.echo(hint, err=as_json)
    raise SystemExit(0 if plan.fits else 1)
