"""Every cache lmforge fills is a named folder under one root, ``$LMFORGE_CACHE_DIR`` when it is set.

Before ``lmforge.paths`` named them, the model download read ``$LMFORGE_CACHE_DIR`` as its own folder
while the other caches put theirs under it, and downloaded adapters went to the folder *above* it
(``/data/cache`` put them in ``/data/adapters``).
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from lmforge import import_cache, paths


class _Plan:
    def cache_key(self) -> str:
        return "key"


def test_the_root_is_the_variable_else_xdg_else_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LMFORGE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.cache_root() == tmp_path / "home" / ".cache" / "lmforge"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_root() == tmp_path / "xdg" / "lmforge"
    monkeypatch.setenv("LMFORGE_CACHE_DIR", str(tmp_path / "mine"))
    assert paths.cache_root() == tmp_path / "mine"


def test_every_cache_is_a_named_folder_under_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmforge.adapters.sources import SourcePolicy
    from lmforge.config import ServingConfig
    from lmforge.engines.trtllm.compile import cache_dir as engine_cache
    from lmforge.engines.trtllm.quantize import checkpoint_cache_dir

    root = tmp_path / "data" / "cache"
    monkeypatch.setenv("LMFORGE_CACHE_DIR", str(root))
    assert SourcePolicy.from_config(ServingConfig()).cache_dir == root / "adapters"
    assert import_cache.cache_dir() == root / "python-imports"
    assert engine_cache(_Plan()) == root / "trtllm" / "key"  # type: ignore[arg-type]
    assert checkpoint_cache_dir(_Plan()) == root / "trtllm-quant" / "key"  # type: ignore[arg-type]
    kinds = get_args(paths.CacheKind)
    assert len(set(kinds)) == len(kinds) and all(paths.cache_dir(k).parent == root for k in kinds)


def test_a_download_lands_in_the_models_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmforge.artifacts import download

    root = tmp_path / "cache"
    monkeypatch.setenv("LMFORGE_CACHE_DIR", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(download.DownloadError, match=str(root / "models")):
        download.fetch_model("example-org/never-downloaded")
