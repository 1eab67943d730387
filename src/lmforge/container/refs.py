"""Image references: the repository path of ``[HOST/]PATH[:TAG][@DIGEST]`` and lmforge's own names."""

from __future__ import annotations


def repository_path(image: str) -> list[str]:
    """The repository path of an image reference, without registry host, tag or digest."""
    ref = image.split("@", 1)[0]
    head, _, last = ref.rpartition("/")
    if ":" in last:
        last = last.split(":", 1)[0]
    parts = [*(head.split("/") if head else []), last]
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]  # a registry host
    return [p for p in parts if p]


def lmforge_flavour_of(image: str) -> str | None:
    """lmforge's flavour that ``image`` names (``.../lmforge-cpu:TAG``, ``lmforge/cpu:TAG``), or None."""
    parts = repository_path(image)
    if parts and parts[-1].startswith("lmforge-"):
        return parts[-1][len("lmforge-") :]
    if len(parts) >= 2 and parts[-2] == "lmforge":
        return parts[-1]
    return None


def is_lmforge_image(image: str) -> bool:
    """Whether ``image`` names one of lmforge's images (``lmforge-<flavour>``, ``lmforge/<flavour>``,
    or a repository called ``lmforge``)."""
    parts = repository_path(image)
    return bool(parts) and ("lmforge" in parts or parts[-1].startswith("lmforge-"))
