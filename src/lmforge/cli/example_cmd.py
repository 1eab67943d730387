"""``lmforge example-model DIR``: write the tiny example model."""

from __future__ import annotations

import time
from pathlib import Path

import click

SAMPLE_CURL = (
    "curl -N localhost:8080/invocations -H 'Content-Type: application/json' "
    '-d \'{"inputs":"def ","parameters":{"max_new_tokens":32,"details":true},"stream":true}\''
)


@click.command("example-model")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--overwrite", is_flag=True, help="Write the model's files into a non-empty DIR.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
def example_model_command(directory: Path, overwrite: bool, seed: int) -> None:
    """Write a tiny random-weight Llama to DIR: weights, a tokenizer trained on the Python standard
    library, a chat template and a serving.properties. Takes seconds and needs no hub or network.

    Its text is gibberish: it is for trying and testing lmforge."""
    if directory.is_dir() and any(directory.iterdir()) and not overwrite:
        raise click.UsageError(
            f"{directory} is not empty; choose a new or empty folder, or pass --overwrite to write into it"
        )
    from lmforge.models.example import write_example_model

    started = time.monotonic()
    try:
        out = write_example_model(directory, seed=seed, overwrite=overwrite, progress=click.echo)
    except (FileExistsError, PermissionError) as exc:
        raise click.ClickException(str(exc)) from exc
    files = [f for f in out.iterdir() if f.is_file()]
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    click.echo(f"wrote {out} ({len(files)} files, {size_mb:.1f} MB) in {time.monotonic() - started:.1f} s")
    click.echo("")
    click.echo(f"Next: lmforge serve {out}")
    click.echo("then, in another shell:")
    click.echo(f"  {SAMPLE_CURL}")
