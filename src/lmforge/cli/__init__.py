"""The ``lmforge`` command line."""

from __future__ import annotations

import click

from lmforge import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lmforge")
def main() -> None:
    """Build, run and deploy LLM serving containers in the style of AWS LMI."""


def _register() -> None:
    from lmforge.cli.config_cmd import config_group
    from lmforge.cli.example_cmd import example_model_command
    from lmforge.cli.package_cmd import package_command
    from lmforge.cli.serve_cmd import serve_command

    main.add_command(serve_command)
    main.add_command(example_model_command)
    main.add_command(config_group)
    main.add_command(package_command)


_register()
