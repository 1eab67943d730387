from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmforge.artifacts import MANIFEST_NAME, PackageError, package_model, safe_extract
from lmforge.cli import main


def make_folder(root: Path) -> Path:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "serving.properties").write_text("engine=Python\noption.max_rolling_batch_size=4\n")
    (root / "model.py").write_text("def handle(inputs):\n    return None\n")
    (root / "sub" / "weights.bin").write_bytes(os.urandom(100_000))
    (root / "sub" / "deeper" / "naïve name.txt").write_text("unicode path")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"junk")
    return root


def test_same_folder_same_bytes_even_after_touching_files(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "m")
    a = package_model(src, tmp_path / "a.tar.gz")
    later = os.stat(src).st_mtime + 3600  # every file touched an hour on
    for p in src.rglob("*"):
        os.utime(p, (later, later))
    b = package_model(src, tmp_path / "b.tar.gz")
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    assert a.sha256 == b.sha256


def test_archive_layout_and_manifest(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "m")
    package_model(src, tmp_path / "m.tar.gz")
    with tarfile.open(tmp_path / "m.tar.gz") as tar:
        members = tar.getmembers()
        assert members[0].name == MANIFEST_NAME
        assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in members)
        names = [m.name for m in members]
        assert "__pycache__/model.cpython-311.pyc" not in names
        assert tar.getmember("run.sh").mode == 0o755
        assert tar.getmember("model.py").mode == 0o644
        manifest = json.loads(tar.extractfile(MANIFEST_NAME).read())  # type: ignore[union-attr]
    paths = [f["path"] for f in manifest["files"]]
    assert paths == sorted(paths)
    assert "sub/deeper/naïve name.txt" in paths
    out = tmp_path / "out"
    extracted = safe_extract(tmp_path / "m.tar.gz", out)
    assert sorted(extracted) == sorted(paths)
    assert (out / "sub" / "weights.bin").read_bytes() == (src / "sub" / "weights.bin").read_bytes()


def test_refuses_symlinks_and_invalid_config(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "m")
    (src / "link").symlink_to("/etc/passwd")
    with pytest.raises(PackageError, match="link is a symbolic link"):
        package_model(src, tmp_path / "x.tar.gz")
    (src / "link").unlink()
    (src / "serving.properties").write_text("option.max_rolling_batch_size=zero\n")
    with pytest.raises(PackageError, match=r"serving.properties:1: option.max_rolling_batch_size = 'zero'"):
        package_model(src, tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


def malicious(tmp_path: Path, build) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        build(tar)
    return path


def _file(tar: tarfile.TarFile, name: str, data: bytes = b"x") -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tar.addfile(ti, io.BytesIO(data))


def _link(tar: tarfile.TarFile, name: str, target: str, kind: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, target
    tar.addfile(ti)


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda t: _file(t, "../escape.txt"), "escapes"),
        (lambda t: _file(t, "ok/../../escape.txt"), "escapes"),
        (lambda t: _file(t, "/etc/cron.d/evil"), "absolute"),
        (lambda t: _link(t, "passwd", "/etc/passwd", tarfile.SYMTYPE), "links"),
        (lambda t: _link(t, "hard", "/etc/passwd", tarfile.LNKTYPE), "links"),
        (lambda t: _link(t, "fifo", "", tarfile.FIFOTYPE), "not a regular file"),
    ],
)
def test_malicious_archives_are_refused(tmp_path: Path, build, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PackageError, match=words):
        safe_extract(malicious(tmp_path, build), tmp_path / "out")
    assert not any((tmp_path / "out").iterdir())


def test_tampered_file_fails_the_manifest(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "m")
    package_model(src, tmp_path / "m.tar.gz")
    with tarfile.open(tmp_path / "m.tar.gz") as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]  # type: ignore[union-attr]
    with tarfile.open(tmp_path / "t.tar.gz", "w:gz") as tar:
        for m, data in members:
            if m.name == "model.py":
                data = b"import os; os.system('evil')\n"
                m.size = len(data)
            tar.addfile(m, io.BytesIO(data) if data is not None else None)
    with pytest.raises(PackageError, match=r"model\.py does not match"):
        safe_extract(tmp_path / "t.tar.gz", tmp_path / "out")
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]  # nothing half-extracted is left


def test_cli(tmp_path: Path) -> None:
    src = make_folder(tmp_path / "m")
    result = CliRunner().invoke(main, ["package", str(src), "-o", str(tmp_path / "m.tar.gz")])
    assert result.exit_code == 0, result.output
    assert "Next:" in result.output
    bad = CliRunner().invoke(main, ["package", str(src), "-o", str(src / "inside.tar.gz")])
    assert bad.exit_code == 1
    assert "outside the folder" in bad.output
