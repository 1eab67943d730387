"""Render a flavour's files from ``templates/`` (jinja2, ``StrictUndefined``: a missing setting is an
error, never an empty string)."""

from __future__ import annotations

from pathlib import Path

from lmforge.container.flavours import TEMPLATES, Flavour, load_flavour, repo_root


def render_flavour(flavour: Flavour, root: Path | None = None) -> dict[str, str]:
    """File name -> rendered text for ``flavour``."""
    import jinja2

    base = root or repo_root()
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(base / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    context = flavour.context()
    return {out: env.get_template(template).render(**context) for template, out in TEMPLATES.items()}


def write_flavour(name: str, root: Path | None = None) -> list[Path]:
    """Render ``name`` into ``containers/<name>/``; returns the files whose content changed."""
    base = root or repo_root()
    flavour = load_flavour(name, base)
    changed = []
    for filename, text in render_flavour(flavour, base).items():
        path = base / "containers" / name / filename
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
        if filename.endswith(".sh"):
            path.chmod(0o755)
    return changed


def stale_files(root: Path | None = None) -> list[Path]:
    """Checked-in rendered files that differ from what the templates produce now."""
    base = root or repo_root()
    stale = []
    for name in sorted(p.name for p in (base / "containers").iterdir() if (p / "flavour.toml").exists()):
        for filename, text in render_flavour(load_flavour(name, base), base).items():
            path = base / "containers" / name / filename
            if not path.exists() or path.read_text() != text:
                stale.append(path)
    return stale
