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

#: in DIR: every image id in the store before the build, and those named ``lmforge/...`` then, so that
#: what the run left can be removed after
IMAGES_BEFORE = "images-before.txt"
LMFORGE_NAMED_BEFORE = "lmforge-named-before.txt"


def image_ids(engine: Any, *, dangling: bool = False) -> list[str]:
    """The ids of the store's images, intermediate ones included; only untagged ones with ``dangling``
    (an intermediate image counts as dangling once no image is built on it)."""
    args = ["images", "--all", "--quiet", "--no-trunc", *(["--filter", "dangling=true"] if dangling else [])]
    proc = engine.run_cli(args)
    return sorted(set(proc.stdout.split())) if proc.returncode == 0 else []


def image_names(engine: Any) -> list[tuple[str, str]]:
    """(id, ``repository:tag``) for every name in the store."""
    proc = engine.run_cli(["images", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}"])
    rows = [line.split() for line in proc.stdout.splitlines()] if proc.returncode == 0 else []
    return [(row[0], row[1]) for row in rows if len(row) == 2]


def lmforge_named(engine: Any) -> list[str]:
    """The ids of the images named ``lmforge/<flavour>:...`` (what ``lmforge container build`` tags)."""
    ours = ("lmforge/", "localhost/lmforge/")
    return sorted({image for image, name in image_names(engine) if name.startswith(ours)})


def remove_leftovers(engine: Any, out: Path) -> int:
    """Remove what the run left in the image store: untagged images that appeared since the build
    began (its layers, the run's image once untagged), an ``lmforge/...`` image that a rebuild in the
    run (``--build-image``) took the name from, and, chain by chain, the intermediate images that only
    those were built on. Each run left ~1.2 GB behind before. Images something still uses or names stay;
    so do untagged images that were there before the run. Returns how many were removed."""
    if not (out / IMAGES_BEFORE).exists():
        return 0
    before = set((out / IMAGES_BEFORE).read_text().split())
    named = (out / LMFORGE_NAMED_BEFORE).read_text().split() if (out / LMFORGE_NAMED_BEFORE).exists() else []
    seen = set(image_ids(engine, dangling=True))
    ids = {i for i in seen if i not in before or i in named}
    removed = 0
    for _ in range(64):  # a chain goes leaf first: its parent is dangling only once its child is gone
        if not ids:
            break
        engine.run_cli(["rmi", *sorted(ids)])
        now = set(image_ids(engine, dangling=True))
        gone = ids - now
        if not gone:
            break
        removed += len(gone)
        ids, seen = now - seen, now  # the parents that the removals left unused
    return removed


def build(tag: str, out: Path) -> None:
    from lmforge.container.base import build_base
    from lmforge.container.build import build_flavour
    from lmforge.container.engine import detect
    from lmforge.container.flavours import load_flavour

    engine = detect()
    (out / IMAGES_BEFORE).write_text("\n".join(image_ids(engine)))
    (out / LMFORGE_NAMED_BEFORE).write_text("\n".join(lmforge_named(engine)))
    if not engine.image_exists(load_flavour("cpu").base_image):
        build_base(engine, print)
    # with the engine's layer cache (cold on a fresh machine, as CI's): after a --no-cache build, the
    # test of `lmforge deploy --build-image` re-ran RUN --mount=type=secret steps of it (the wheel stage
    # every run, ~17 CPU-s; once the dependencies too, ~60)
    no_cache = os.environ.get("LMFORGE_IMAGE_TESTS_COLD") == "1"
    result = build_flavour("cpu", engine, lambda line: print(line, flush=True), tag=tag, no_cache=no_cache)
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
