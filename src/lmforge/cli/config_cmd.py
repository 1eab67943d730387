"""``lmforge config show DIR``: the resolved configuration and where each value came from;
``lmforge config reference``: every key, as docs/configuration.md has them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from lmforge.config import ResolvedConfig


@click.group("config")
def config_group() -> None:
    """Inspect a model folder's configuration."""


@config_group.command("show")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
def show_command(model_dir: Path) -> None:
    """Print every key of MODEL_DIR's configuration with its value and source.

    The source is the serving.properties line, the environment variable, or "default". Warnings go
    to stderr; an invalid configuration prints every problem to stderr and exits with status 2.
    """
    from lmforge.config import ConfigError, load_config
    from lmforge.config.show import render_config

    try:
        resolved = load_config(model_dir)
    except ConfigError as exc:
        click.echo(f"error: invalid configuration:\n{exc}", err=True)
        raise SystemExit(2) from None
    for warning in resolved.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(render_config(resolved, include_warnings=False), nl=False)
    click.echo("")
    click.echo(f"handler on this machine (option.rolling_batch={resolved.config.rolling_batch}):")
    for line in _handler_lines(resolved):
        click.echo(f"  {line}")
    compiled = _compile_cache_line(resolved)
    if compiled is not None:
        click.echo("")
        click.echo(f"vLLM {compiled}")


def reference_markdown() -> str:
    """The configuration reference: the config layer's keys, then the sections the engines add (vLLM's
    option mapping). Joined here, above both layers, so the config layer never imports an engine."""
    from lmforge.config.show import render_reference_markdown
    from lmforge.engines.vllm.options import mapping_markdown

    return render_reference_markdown([mapping_markdown()])


@config_group.command("reference")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write it to this file (docs/configuration.md in the repository) instead of stdout.",
)
def reference_command(output: Path | None) -> None:
    """Print every configuration key (serving.properties and environment) with its type, default and
    meaning, in Markdown."""
    text = reference_markdown()
    if output is None:
        click.echo(text, nl=False)
        return
    output.write_text(text, encoding="utf-8")
    click.echo(f"wrote {output}", err=True)


def _handler_lines(resolved: ResolvedConfig) -> list[str]:
    """What serves this folder here: its model.py, or the backend ``option.rolling_batch`` gives (why)."""
    from lmforge.engines.registry import explain_choice
    from lmforge.handlers.custom import find_entry_point

    config = resolved.config
    entry_point = find_entry_point(config.model_dir, config.entry_point)
    if entry_point is not None:
        return [f"custom: {entry_point} (handle(inputs) serves; option.rolling_batch is for it to use)"]
    return explain_choice(config.rolling_batch)


def _compile_cache_line(resolved: ResolvedConfig) -> str | None:
    """``compile cache: hit|miss (...)|none`` as a vLLM start of this folder would decide it here (None
    when vLLM does not serve it). With a compiled artifact present this imports vLLM (a few seconds):
    the engine arguments to compare come from vLLM's own argument parser, as at a start."""
    from lmforge.engines.registry import BackendUnavailableError, select_backend
    from lmforge.handlers.custom import find_entry_point

    config = resolved.config
    if find_entry_point(config.model_dir, config.entry_point) is not None:
        return None
    try:
        if select_backend(config.rolling_batch).name != "vllm":
            return None
    except BackendUnavailableError:
        return None
    from lmforge.engines.vllm import compile_run
    from lmforge.errors import LmforgeError

    try:
        return compile_run.decide_here(config, resolved.extra_options).line()
    except LmforgeError as exc:
        return f"compile cache: unknown ({exc.message})"
