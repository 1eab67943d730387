"""Model download for option.model_id: s5cmd when present (against a FAKE s5cmd that records its
command line), the cache marker, hub ids offline, what counts as remote."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from lmforge.artifacts.download import DownloadError, fetch_model, is_remote


def _fake_s5cmd(tmp_path: Path, source: Path) -> Path:
    """A stand-in for s5cmd (named as such): logs argv, copies ``source`` into the destination."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "s5cmd"
    log = tmp_path / "s5cmd.log"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {shlex.quote(str(log))}\n'
        "for last; do :; done\n"
        f'cp -r {shlex.quote(str(source))}/. "$last"\n'
    )
    script.chmod(0o755)
    return log


def test_s5cmd_is_used_when_present_and_the_result_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "bucket-content"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"a": 1}))
    log = _fake_s5cmd(tmp_path, source)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    lines: list[str] = []
    first = fetch_model("s3://models/llama/v1/", cache_dir=tmp_path / "cache", progress=lines.append)
    assert json.loads((first / "config.json").read_text()) == {"a": 1}
    assert log.read_text().split() == [
        "--endpoint-url",
        "http://127.0.0.1:9",
        "cp",
        "s3://models/llama/v1/*",
        f"{first}/",
    ]
    assert "with s5cmd" in lines[0]
    again = fetch_model("s3://models/llama/v1/", cache_dir=tmp_path / "cache", progress=lines.append)
    assert again == first and len(log.read_text().splitlines()) == 1  # a finished download is reused


def test_failed_s5cmd_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "s5cmd").write_text("#!/bin/sh\necho 'ERROR: NoSuchBucket' >&2\nexit 1\n")
    (bin_dir / "s5cmd").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(DownloadError, match="NoSuchBucket"):
        fetch_model("s3://missing/x", cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_hub_id_offline_is_refused_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        DownloadError,
        match=r"offline mode is on \(HF_HUB_OFFLINE=1 or LMFORGE_OFFLINE\) and the model is not in the cache",
    ):
        fetch_model("example-org/never-downloaded", cache_dir=tmp_path / "cache")


def test_what_is_remote(tmp_path: Path) -> None:
    assert is_remote("s3://b/p") and is_remote("meta-llama/Llama-3.1-8B")
    assert (
        not is_remote(str(tmp_path))
        and not is_remote("https://example.com/x")
        and not is_remote("./local/dir")
    )


@pytest.mark.parametrize(("whole_objects", "ranged"), [(False, True), (True, False)])
def test_whole_objects_come_in_one_get_each(tmp_path: Path, whole_objects: bool, ranged: bool) -> None:
    """boto3's transfer manager reads an object over its threshold in ranged GETs; the local S3 (moto)
    reads the whole object for each of them, so the local provisioner asks for one plain GET each."""
    import boto3
    import moto

    from lmforge.artifacts.download import download_prefix

    data = os.urandom(9 * 2**20)  # over boto3's 8 MiB multipart threshold
    ranges: list[str | None] = []
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="models")
        s3.put_object(Bucket="models", Key="m/model.safetensors", Body=data)
        s3.meta.events.register(
            "before-send.s3.GetObject", lambda request, **_: ranges.append(request.headers.get("Range"))
        )
        count, total = download_prefix(s3, "models", "m", tmp_path / "out", whole_objects=whole_objects)
    assert (count, total) == (1, len(data))
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == data
    assert ranges and all((r is not None) == ranged for r in ranges), ranges
