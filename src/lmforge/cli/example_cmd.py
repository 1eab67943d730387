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
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--overwrite", is_flag=True, help="Write into a non-empty folder.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
def example_model_command(directory: Path, overwrite: bool, seed: int) -> None:
    """Write a tiny random-weight Llama, its tokenizer, a chat template and a serving.properties
    to DIRECTORY (seconds, no hub). Its text is gibberish: it is for trying and testing lmforge."""
    if directory.is_dir() and any(directory.iterdir()) and not overwrite:
        raise click.UsageError(f"{directory} is not empty; pass --overwrite to write into it")
    from lmforge.models.example import write_example_model

    click.echo("training a byte-level BPE tokenizer on the Python standard library, building the model...")
    started = time.monotonic()
    out = write_example_model(directory, seed=seed, overwrite=overwrite)
    files = [f for f in out.iterdir() if f.is_file()]
    size_mb = sum(f.stat().st_size for f in files) / 2**20
    click.echo(f"wrote {out} ({len(files)} files, {size_mb:.1f} MB) in {time.monotonic() - started:.1f} s")
    click.echo(f"Next: lmforge serve {out}")
    click.echo(f"then: {SAMPLE_CURL}")
