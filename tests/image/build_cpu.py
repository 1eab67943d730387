"""Build the cpu image for the image tests in a process of its own, so it can run while the other
tests do: ``python tests/image/build_cpu.py TAG RESULT_JSON`` (progress on stdout, the
:class:`~lmforge.container.build.BuildResult` as JSON in RESULT_JSON)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path


def main(tag: str, result_path: str) -> int:
    from lmforge.container.base import build_base
    from lmforge.container.build import build_flavour
    from lmforge.container.engine import detect
    from lmforge.container.flavours import load_flavour

    engine = detect()
    if not engine.image_exists(load_flavour("cpu").base_image):
        build_base(engine, print)
    result = build_flavour("cpu", engine, lambda line: print(line, flush=True), tag=tag, no_cache=True)
    Path(result_path).write_text(json.dumps(dataclasses.asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
