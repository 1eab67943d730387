"""``lmforge serve DIR``: run the model server on a model folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click


@click.command("serve")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--host",
    default=lambda: os.environ.get("LMFORGE_HOST", "127.0.0.1"),
    show_default="127.0.0.1, or $LMFORGE_HOST; use 0.0.0.0 inside a container",
    help="Address to bind.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Port to bind [default: $SAGEMAKER_BIND_TO_PORT or 8080].",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
def serve_command(model_dir: Path, host: str, port: int | None, log_level: str) -> None:
    """Serve MODEL_DIR (serving.properties + weights, or a model.py) over the SageMaker contract:
    GET /ping and POST /invocations."""
    from lmforge.serving.launcher import serve

    sys.exit(serve(str(model_dir), host=host, port=port, log_level=log_level))
