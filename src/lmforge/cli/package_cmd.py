"""``lmforge package DIR``: a deterministic ``model.tar.gz`` with a manifest."""

from __future__ import annotations

from pathlib import Path

import click

from lmforge.cli.progress import progress_to


@click.command("package")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="[default: ./model.tar.gz]",
)
def package_command(model_dir: Path, output: Path | None) -> None:
    """Pack MODEL_DIR into a model.tar.gz for SageMaker: validated config, sorted entries, fixed
    times and owners (same folder, same bytes), and a manifest with every file's sha256."""
    from lmforge.artifacts import PackageError, package_model

    out = output or Path("model.tar.gz")
    try:
        with progress_to(f"packing {model_dir}") as report:
            result = package_model(model_dir, out, progress=report)
    except PackageError as exc:
        raise click.ClickException(str(exc)) from None
    mb = result.total_bytes / 2**20
    click.echo(
        f"wrote {result.output} ({len(result.files)} files, {mb:.1f} MB, sha256 {result.sha256[:16]}...)"
    )
    click.echo(
        f"Next: lmforge deploy {model_dir} --endpoint-name NAME --instance-type TYPE (packs and uploads"
    )
    click.echo(f"      it for you), or inspect it with: tar -tzvf {result.output}")
