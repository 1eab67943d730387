"""lmforge.import_cache: transformers' import scans from a file, the same answers as the scans."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge import import_cache
from lmforge.import_cache import ScanCache


def _transformers_dir() -> Path:
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def _counting(result: object) -> tuple[list[int], object]:
    calls: list[int] = []

    def scan(*args: object) -> object:
        calls.append(1)
        return result

    return calls, scan


def test_a_miss_scans_and_writes_a_hit_scans_nothing(tmp_path: Path) -> None:
    mapping = {"yaml": ["PyYAML"], "google": ["protobuf", "googleapis-common-protos"]}
    structure = {frozenset({"torch"}): {"models.llama.modeling_llama": {"LlamaModel"}}, frozenset(): {}}
    first = ScanCache(_transformers_dir(), "5.19.0", tmp_path)
    calls, scan = _counting(mapping)
    assert first.distributions(scan)() == mapping
    define_calls, define = _counting(structure)
    assert first.structures(define)("/x/models", "models") == structure
    assert (len(calls), len(define_calls)) == (1, 1)
    assert first.path.is_file()

    second = ScanCache(_transformers_dir(), "5.19.0", tmp_path)
    assert second.path == first.path
    assert second.distributions(scan)() == mapping
    assert second.structures(define)("/x/models", "models") == structure
    assert (len(calls), len(define_calls)) == (1, 1)
    # another argument is another entry: scanned once, then kept beside the first
    assert second.structures(define)("/x/models/__init__.py") == structure
    assert len(define_calls) == 2
    assert ScanCache(_transformers_dir(), "5.19.0", tmp_path).structures(define)("/x/models/__init__.py")
    assert len(define_calls) == 2


def test_a_damaged_file_is_a_miss(tmp_path: Path) -> None:
    cache = ScanCache(_transformers_dir(), "5.19.0", tmp_path)
    cache.path.parent.mkdir(parents=True, exist_ok=True)
    cache.path.write_bytes(b"\x00not marshal")
    calls, scan = _counting({"a": ["b"]})
    assert ScanCache(_transformers_dir(), "5.19.0", tmp_path).distributions(scan)() == {"a": ["b"]}
    assert calls == [1]


def test_the_key_changes_with_an_install_not_with_other_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    key = ScanCache(_transformers_dir(), "5.19.0", tmp_path).key
    before = key()
    (site / "some_module.py").write_text("x = 1\n")  # code beside: not an install
    (site / "pkg").mkdir()
    assert key() == before
    (site / "pkg-1.0.dist-info").mkdir()  # an install
    installed = key()
    assert installed != before
    (site / "pkg-1.0.dist-info").rename(site / "pkg-1.1.dist-info")  # an upgrade
    assert key() not in (before, installed)
    assert ScanCache(_transformers_dir(), "5.20.0", tmp_path).key() != key()


def test_only_the_tested_release_gets_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers
    import transformers.utils

    finder = import_cache._Finder()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.setattr(transformers, "__version__", "5.20.0")
    spec = finder.find_spec(import_cache.MODULE, transformers.utils.__path__)
    assert spec is not None and not isinstance(spec.loader, import_cache._Loader)
    assert finder not in sys.meta_path  # once

    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    monkeypatch.setattr(transformers, "__version__", "5.19.0")
    spec = finder.find_spec(import_cache.MODULE, transformers.utils.__path__)
    assert spec is not None and isinstance(spec.loader, import_cache._Loader)
    assert finder.find_spec("transformers.utils", transformers.__path__) is None


_THROUGH_THE_CACHE = """
import importlib.metadata, sys
from pathlib import Path
from lmforge import import_cache
import_cache.install()
from transformers.utils import import_utils
cached = import_utils.define_import_structure
assert getattr(cached, "__wrapped__", None) is not None, "transformers was imported without the cache"
loader = import_utils.__spec__.loader
assert isinstance(loader, import_cache._Loader) and loader.cache.searched
models = Path(import_utils.__file__).parents[1] / "models"
import_utils.create_import_structure_from_path.cache_clear()
for args in ((models, "models"), (str(models / "__init__.py"), None)):
    assert cached(*args) == cached.__wrapped__.__wrapped__(*args)  # the lru_cache's function: a scan
assert importlib.metadata.packages_distributions() == import_utils.PACKAGE_DISTRIBUTION_MAPPING
print("ok")
"""


def test_a_process_imports_transformers_through_the_cache_with_the_scans_answers(tmp_path: Path) -> None:
    """As lmforge's processes do (lmforge.process.run_main): what transformers got from the file is
    what its scans give (twice: the first process writes the file, the second reads it)."""
    env = {**os.environ, "LMFORGE_CACHE_DIR": str(tmp_path), "LMFORGE_IMPORT_CACHE": "on"}
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", _THROUGH_THE_CACHE], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
    assert list((tmp_path / "python-imports").glob("*.marshal"))


def test_every_reach_in_is_there_and_a_missing_one_fails_the_import_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import ModuleType

    from lmforge.reachins import ReachError, missing

    assert missing(import_cache._reaches().reaches) == []
    monkeypatch.delattr(importlib.metadata, "packages_distributions")
    loader = import_cache._Loader(None, _transformers_dir(), "5.19.0")
    with pytest.raises(ReachError, match=r"lacks importlib\.metadata\.packages_distributions \(swapped"):
        loader.exec_module(ModuleType(import_cache.MODULE))
