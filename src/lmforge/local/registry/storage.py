"""What the Registry HTTP API cannot answer, read from the registry's filesystem storage (ours: under
the state dir): untagged manifests, push times, removing a tag, dropping a repository."""

from __future__ import annotations

import contextlib
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

from lmforge.local.registry.api import RegistryApi, check_repo


class RegistryStorage(RegistryApi):
    """The registry's filesystem storage under ``data_dir``, beside its HTTP API."""

    data_dir: Path

    def _repo_dir(self, repo: str) -> Path:
        return self.data_dir / "docker" / "registry" / "v2" / "repositories" / check_repo(repo)

    def manifest_digests(self, repo: str) -> list[str]:
        """Every manifest linked into ``repo``, tagged or not (the API can list only tags)."""
        revisions = self._repo_dir(repo) / "_manifests" / "revisions" / "sha256"
        try:
            entries = list(revisions.iterdir())
        except OSError:
            return []
        return sorted(f"sha256:{e.name}" for e in entries if (e / "link").is_file())

    def pushed_at(self, repo: str, digest: str) -> datetime | None:
        """When ``digest`` was linked into ``repo`` (or its blob written), from the storage's mtimes."""
        algorithm, _, hex_digest = digest.partition(":")
        candidates = (
            self._repo_dir(repo) / "_manifests" / "revisions" / algorithm / hex_digest / "link",
            self.data_dir / "docker/registry/v2/blobs" / algorithm / hex_digest[:2] / hex_digest / "data",
        )
        for path in candidates:
            with contextlib.suppress(OSError):
                return datetime.fromtimestamp(path.stat().st_mtime, UTC)
        return None

    def untag(self, repo: str, tag: str) -> bool:
        """Remove one tag, keeping its manifest; False when there was no such tag."""
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", tag):
            return False
        tag_dir = self._repo_dir(repo) / "_manifests" / "tags" / tag
        if not tag_dir.is_dir():
            return False
        shutil.rmtree(tag_dir)
        return True

    def remove_repository(self, repo: str) -> int:
        """Delete every manifest of ``repo`` and drop it from the catalog; returns how many manifests."""
        deleted = sum(self.delete_manifest(repo, digest) for digest in self.manifest_digests(repo))
        shutil.rmtree(self._repo_dir(repo), ignore_errors=True)
        return deleted
