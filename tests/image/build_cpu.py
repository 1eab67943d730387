"""Build the cpu image for the image tests in a process of its own, so it can run while the other
tests do: ``python tests/image/build_cpu.py TAG DIR`` (progress on stdout; in DIR, ``result.json``:
the :class:`~lmforge.container.build.BuildResult` as JSON, and ``exit``: the exit status, written
last, whatever happened)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path


def build(tag: str, out: Path) -> None:
    from lmforge.container.base import build_base
    from lmforge.container.build import build_flavour
    from lmforge.container.engine import detect
    from lmforge.container.flavours import load_flavour

    engine = detect()
    if not engine.image_exists(load_flavour("cpu").base_image):
        build_base(engine, print)
    result = build_flavour("cpu", engine, lambda line: print(line, flush=True), tag=tag, no_cache=True)
    (out / "result.json.part").write_text(json.dumps(dataclasses.asdict(result)))
    os.replace(out / "result.json.part", out / "result.json")


def main(tag: str, out: str) -> int:
    code = 1
    try:
        build(tag, Path(out))
        code = 0
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        (Path(out) / "exit").write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
