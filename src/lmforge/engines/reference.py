"""docs/configuration.md: the configuration reference of :mod:`lmforge.config` with the sections the
engines add (vLLM's option mapping). Lives with the engines so that the config layer never imports
them. Regenerate with ``python -c "from lmforge.engines.reference import write; write()"``."""

from __future__ import annotations

from pathlib import Path


def configuration_markdown() -> str:
    from lmforge.config.show import render_reference_markdown
    from lmforge.engines.vllm.options import mapping_markdown

    return render_reference_markdown([mapping_markdown()])


def write(path: Path = Path("docs/configuration.md")) -> None:
    path.write_text(configuration_markdown(), encoding="utf-8")
