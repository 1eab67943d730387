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
from typing import Any

#: in DIR: every image id in the store before the build, so that what it left can be removed after
IMAGES_BEFORE = "images-before.txt"


def image_ids(engine: Any, *, dangling: bool = False) -> list[str]:
    """The ids of the store's images, intermediate ones included; only untagged ones with ``dangling``."""
    args = ["images", "--all", "--quiet", "--no-trunc", *(["--filter", "dangling=true"] if dangling else [])]
    proc = engine.run_cli(args)
    return sorted(set(proc.stdout.split())) if proc.returncode == 0 else []


def remove_leftovers(engine: Any, out: Path) -> int:
    """Remove the untagged images that appeared since the build began (its layers, the run's image once
    untagged, a cached rebuild's own): each test run would otherwise leave ~1.2 GB in the store. An
    image something still uses or tags stays. Returns how many were removed."""
    before = set((out / IMAGES_BEFORE).read_text().split()) if (out / IMAGES_BEFORE).exists() else None
    if before is None:
        return 0
    removed = 0
    for _ in range(64):  # a chain goes leaf first: its parent is untagged-and-unused only after
        ids = [i for i in image_ids(engine, dangling=True) if i not in before]
        if not ids:
            break
        engine.run_cli(["rmi", *ids])
        left = set(image_ids(engine, dangling=True))
        gone = sum(1 for i in ids if i not in left)
        if not gone:
            break
        removed += gone
    return removed


def build(tag: str, out: Path) -> None:
    from lmforge.container.base import build_base
    from lmforge.container.build import build_flavour
    from lmforge.container.engine import detect
    from lmforge.container.flavours import load_flavour

    engine = detect()
    (out / IMAGES_BEFORE).write_text("\n".join(image_ids(engine)))
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
