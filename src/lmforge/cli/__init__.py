"""The ``lmforge`` command line."""

from __future__ import annotations

from typing import NoReturn

import click

from lmforge import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lmforge")
def main() -> None:
    """Build, run and deploy LLM serving containers in the style of AWS LMI."""


def _register() -> None:
    from lmforge.cli.adapter_cmd import adapter_group
    from lmforge.cli.bench_cmd import bench_command
    from lmforge.cli.compile_cmd import compile_command
    from lmforge.cli.config_cmd import config_group
    from lmforge.cli.container_cmd import container_group, image_uri_command
    from lmforge.cli.deploy_cmd import delete_command, deploy_command, wait_command
    from lmforge.cli.example_cmd import example_model_command
    from lmforge.cli.invoke_cmd import invoke_command
    from lmforge.cli.local_cmd import local_group
    from lmforge.cli.package_cmd import package_command
    from lmforge.cli.plan_cmd import plan_command
    from lmforge.cli.serve_cmd import serve_command
    from lmforge.cli.upload_cmd import upload_command

    main.add_command(serve_command)
    main.add_command(example_model_command)
    main.add_command(config_group)
    main.add_command(package_command)
    main.add_command(plan_command)
    main.add_command(upload_command)
    main.add_command(local_group)
    main.add_command(deploy_command)
    main.add_command(wait_command)
    main.add_command(delete_command)
    main.add_command(invoke_command)
    main.add_command(adapter_group)
    main.add_command(container_group)
    main.add_command(compile_command)
    main.add_command(image_uri_command)
    main.add_command(bench_command)


def run() -> NoReturn:
    """The ``lmforge`` command: :func:`main`, then a process exit without the interpreter's teardown
    (:mod:`lmforge.process`)."""
    from lmforge.process import run_main

    run_main(main)


_register()
