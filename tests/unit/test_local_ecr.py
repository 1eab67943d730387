"""The local ECR: ECR image URIs, and moto's ECR served from a real registry (lmforge.local.ecr/registry).

The integration part runs a real ``docker-registry`` and a real moto server on loopback, pushes a real
image with podman after logging in with ``GetAuthorizationToken``'s answer, and checks the ECR calls
against what the registry holds. It skips when podman or the registry binary is absent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lmforge.local import ecr
from lmforge.local.ecr import EcrImage, parse_ecr_uri, resolve
from lmforge.local.registry import (
    BINARY_ENV,
    OCI_INDEX,
    LocalRegistry,
    RegistryError,
    find_registry_binary,
)

pytestmark = pytest.mark.xdist_group("local-ecr")

ACCOUNT = "123456789012"
REGION = "us-west-2"
DIGEST = "sha256:" + "ab" * 32


# ---- URIs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/lmforge-cpu:0.1.0",
            EcrImage(ACCOUNT, "us-west-2", "lmforge-cpu", "0.1.0", None),
        ),
        (
            f"{ACCOUNT}.dkr.ecr.eu-central-1.amazonaws.com/team/sub/repo",
            EcrImage(ACCOUNT, "eu-central-1", "team/sub/repo", "latest", None),
        ),
        (
            f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/repo@{DIGEST}",
            EcrImage(ACCOUNT, "us-east-1", "repo", None, DIGEST),
        ),
        (
            f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/repo:v1@{DIGEST}",
            EcrImage(ACCOUNT, "us-east-1", "repo", "v1", DIGEST),
        ),
        (
            f"{ACCOUNT}.dkr.ecr.cn-north-1.amazonaws.com.cn/my_repo.x-y:V_1.2-rc",
            EcrImage(ACCOUNT, "cn-north-1", "my_repo.x-y", "V_1.2-rc", None, "amazonaws.com.cn"),
        ),
        (
            f"{ACCOUNT}.dkr.ecr-fips.us-gov-west-1.amazonaws.com/repo:1",
            EcrImage(ACCOUNT, "us-gov-west-1", "repo", "1", None),
        ),
        ("docker.io/library/python:3.11", None),
        ("python:3.11", None),
        ("127.0.0.1:5000/repo:v1", None),
        ("12345678901.dkr.ecr.us-west-2.amazonaws.com/repo:v1", None),  # 11 digits
        (f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/Repo:v1", None),  # upper case name
        (f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/repo:.bad", None),
        (f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/", None),
        (f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com.evil.com/repo:v1", None),
        (f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/repo@sha256:abc", None),
    ],
)
def test_parse_ecr_uri(uri: str, expected: EcrImage | None) -> None:
    assert parse_ecr_uri(uri) == expected


def test_ecr_image_host_and_reference() -> None:
    image = parse_ecr_uri(f"{ACCOUNT}.dkr.ecr.cn-north-1.amazonaws.com.cn/a/b:v2@{DIGEST}")
    assert image is not None
    assert image.host == f"{ACCOUNT}.dkr.ecr.cn-north-1.amazonaws.com.cn"
    assert image.reference == DIGEST  # the digest wins over the tag
    untagged = parse_ecr_uri(f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/a")
    assert untagged is not None
    assert untagged.reference == "latest"


def test_resolve(tmp_path: Path) -> None:
    registry = LocalRegistry(tmp_path, port=5123)  # never started: resolve needs only its address
    host = f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com"
    assert resolve(f"{host}/lmforge-cpu:0.1.0", ACCOUNT, registry) == "127.0.0.1:5123/lmforge-cpu:0.1.0"
    assert resolve(f"{host}/team/repo", ACCOUNT, registry) == "127.0.0.1:5123/team/repo:latest"
    assert resolve(f"{host}/repo:v1@{DIGEST}", ACCOUNT, registry) == f"127.0.0.1:5123/repo@{DIGEST}"
    # every region of the account maps to the one registry
    other_region = f"{ACCOUNT}.dkr.ecr.ap-south-1.amazonaws.com/repo:v1"
    assert resolve(other_region, ACCOUNT, registry) == "127.0.0.1:5123/repo:v1"
    assert resolve("210987654321.dkr.ecr.us-west-2.amazonaws.com/repo:v1", ACCOUNT, registry) is None
    assert resolve("docker.io/library/python:3.11", ACCOUNT, registry) is None
    assert registry.url == "http://127.0.0.1:5123"


# ---- the registry binary -------------------------------------------------------------------------


def test_missing_binary_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "no-such-registry"))
    assert find_registry_binary() is None
    with pytest.raises(RegistryError) as caught:
        LocalRegistry(tmp_path).start()
    message = str(caught.value)
    assert "apt-get install docker-registry" in message
    assert BINARY_ENV in message
    assert "registry" in message


def test_binary_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "my-registry"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv(BINARY_ENV, str(fake))
    assert find_registry_binary() == str(fake)
    with pytest.raises(RegistryError, match="exited with status 3"):
        LocalRegistry(tmp_path / "state").start()
    assert not (tmp_path / "state" / "registry" / "registry.pid").exists()


def test_moto_has_what_the_patches_need() -> None:
    ecr.check_compatible()


# ---- against a real registry, a real moto server and podman ------------------------------------------


def _need(*tools: str) -> None:
    if find_registry_binary() is None:
        pytest.skip("no registry binary (apt-get install docker-registry)")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def _podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def base_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A tiny real image (one small layer), imported into podman's store for this module only."""
    _need("podman")
    folder = tmp_path_factory.mktemp("image")
    (folder / "hello.txt").write_text("hello from the local ECR test\n")
    with tarfile.open(folder / "rootfs.tar", "w") as tar:
        tar.add(folder / "hello.txt", arcname="hello.txt")
    name = f"localhost/lmforge-ecr-test:{secrets.token_hex(4)}"
    _podman("import", "--change", 'CMD ["/hello.txt"]', str(folder / "rootfs.tar"), name)
    try:
        yield name
    finally:
        _podman("rmi", name, check=False)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    _need()
    reg = LocalRegistry(tmp_path_factory.mktemp("ecr-state"))
    reg.start()
    try:
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="module")
def moto_url(registry: LocalRegistry) -> Iterator[str]:
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    ecr.install(registry)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        ecr.install(None)  # the rest of the process gets moto's own image calls back


@pytest.fixture(scope="module")
def client(moto_url: str) -> Any:
    import boto3

    return boto3.client(
        "ecr",
        region_name=REGION,
        endpoint_url=moto_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


class Pusher:
    """Tags the base image for the local registry and pushes it; untags everything at the end."""

    def __init__(self, registry: LocalRegistry, image: str, authfile: Path) -> None:
        self.registry = registry
        self.image = image
        self.authfile = authfile
        self.names: list[str] = []

    def push(self, repo: str, tag: str, fmt: str = "oci") -> str:
        name = f"{self.registry.address}/{repo}:{tag}"
        _podman("tag", self.image, name)
        self.names.append(name)
        digest_file = self.authfile.parent / f"digest-{len(self.names)}"
        _podman(
            "push",
            "--tls-verify=false",
            "--authfile",
            str(self.authfile),
            "--format",
            fmt,
            "--digestfile",
            str(digest_file),
            name,
        )
        return digest_file.read_text().strip()

    def cleanup(self) -> None:
        for name in self.names:
            _podman("untag", self.image, name, check=False)


@pytest.fixture(scope="module")
def pusher(
    registry: LocalRegistry, base_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pusher]:
    p = Pusher(registry, base_image, tmp_path_factory.mktemp("podman") / "auth.json")
    try:
        yield p
    finally:
        p.cleanup()


def _login(client: Any, authfile: Path) -> dict[str, Any]:
    """podman logs in to the registry with an ECR authorization token; the token's data."""
    data: dict[str, Any] = client.get_authorization_token()["authorizationData"][0]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    host = data["proxyEndpoint"].removeprefix("http://")
    _podman("login", "--tls-verify=false", "--authfile", str(authfile), "-u", user, "-p", password, host)
    return data


def _error_code(exc: BaseException) -> str:
    code: str = exc.response["Error"]["Code"]  # type: ignore[attr-defined]
    return code


@pytest.mark.integration
def test_registry_answers(registry: LocalRegistry, tmp_path: Path) -> None:
    assert registry.running
    assert registry.url == f"http://{registry.address}"
    assert registry.address.startswith("127.0.0.1:")
    config = (registry.dir / "config.yml").read_text()
    assert "delete:\n    enabled: true" in config
    assert registry.address in config
    assert int((registry.dir / "registry.pid").read_text()) > 0
    assert registry.tags("nothing-here") == []
    assert registry.manifest("nothing-here", "latest") is None
    assert registry.manifest_digests("nothing-here") == []
    port = int(registry.address.rsplit(":", 1)[1])
    with pytest.raises(RegistryError, match="cannot listen on"):  # not fooled by the one answering there
        LocalRegistry(tmp_path, port=port).start()


@pytest.mark.integration
def test_push_describe_get_delete(client: Any, registry: LocalRegistry, pusher: Pusher) -> None:
    from botocore.exceptions import ClientError

    repo = client.create_repository(repositoryName="myrepo")["repository"]
    assert repo["repositoryUri"] == f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/myrepo"

    # what a client does with real ECR: token -> login to proxyEndpoint -> push to its host
    asked = datetime.now(UTC)
    data = _login(client, pusher.authfile)
    answered = datetime.now(UTC)
    assert data["proxyEndpoint"] == registry.url
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    assert user == "AWS"
    assert len(password) >= 32
    # 12 hours from when it was asked for (the wire carries whole seconds: one either side)
    lifetime, second = timedelta(hours=12), timedelta(seconds=1)
    assert asked + lifetime - second <= data["expiresAt"] <= answered + lifetime + second
    host = data["proxyEndpoint"].removeprefix("http://")
    assert host in json.loads(pusher.authfile.read_text())["auths"]
    second = client.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    assert second != data["authorizationToken"]

    before = datetime.now(UTC) - timedelta(seconds=2)
    oci = pusher.push("myrepo", "v1")  # OCI manifest
    docker = pusher.push("myrepo", "v2", fmt="v2s2")  # same layers, Docker manifest: another digest
    assert oci != docker
    client.put_image(  # a second tag on the Docker image, the ECR way (batch_get_image + put_image)
        repositoryName="myrepo",
        imageTag="v3",
        imageManifest=client.batch_get_image(repositoryName="myrepo", imageIds=[{"imageTag": "v2"}])[
            "images"
        ][0]["imageManifest"],
    )

    details = {d["imageDigest"]: d for d in client.describe_images(repositoryName="myrepo")["imageDetails"]}
    assert set(details) == {oci, docker}
    assert details[oci]["imageTags"] == ["v1"]
    assert sorted(details[docker]["imageTags"]) == ["v2", "v3"]
    manifest = registry.manifest("myrepo", oci)
    assert manifest is not None
    layers = json.loads(manifest.raw)
    expected_size = layers["config"]["size"] + sum(layer["size"] for layer in layers["layers"])
    assert details[oci]["imageSizeInBytes"] == expected_size > 0
    assert details[oci]["imageManifestMediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert details[oci]["artifactMediaType"] == "application/vnd.oci.image.config.v1+json"
    assert details[docker]["imageManifestMediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    for detail in details.values():
        assert detail["registryId"] == ACCOUNT
        assert detail["repositoryName"] == "myrepo"
        assert before <= detail["imagePushedAt"] <= datetime.now(UTC) + timedelta(seconds=2)

    listed = client.list_images(repositoryName="myrepo")["imageIds"]
    assert sorted((i["imageTag"], i["imageDigest"]) for i in listed) == [
        ("v1", oci),
        ("v2", docker),
        ("v3", docker),
    ]

    # by id, and what is not there
    one = client.describe_images(repositoryName="myrepo", imageIds=[{"imageTag": "v3"}])["imageDetails"]
    assert [d["imageDigest"] for d in one] == [docker]
    both = client.describe_images(
        repositoryName="myrepo", imageIds=[{"imageDigest": oci}, {"imageTag": "v1", "imageDigest": oci}]
    )["imageDetails"]
    assert [d["imageDigest"] for d in both] == [oci]
    with pytest.raises(ClientError) as caught:
        client.describe_images(repositoryName="myrepo", imageIds=[{"imageTag": "v1"}, {"imageTag": "nope"}])
    assert _error_code(caught.value) == "ImageNotFoundException"
    with pytest.raises(ClientError) as caught:
        client.describe_images(repositoryName="not-a-repo")
    assert _error_code(caught.value) == "RepositoryNotFoundException"

    got = client.batch_get_image(
        repositoryName="myrepo",
        imageIds=[
            {"imageTag": "v1"},
            {"imageDigest": docker},
            {"imageTag": "nope"},
            {"imageTag": "v1", "imageDigest": docker},
        ],
    )
    assert [i["imageId"] for i in got["images"]] == [
        {"imageDigest": oci, "imageTag": "v1"},
        {"imageDigest": docker},
    ]
    assert got["images"][0]["imageManifest"].encode() == manifest.raw
    assert "sha256:" + hashlib.sha256(got["images"][0]["imageManifest"].encode()).hexdigest() == oci
    assert got["images"][0]["imageManifestMediaType"] == manifest.media_type
    assert [(f["imageId"], f["failureCode"]) for f in got["failures"]] == [
        ({"imageTag": "nope"}, "ImageNotFound"),
        ({"imageTag": "v1", "imageDigest": docker}, "ImageTagDoesNotMatchDigest"),
    ]

    # put_image: the same tag again, and a manifest whose blobs are not in the registry
    with pytest.raises(ClientError) as caught:
        client.put_image(
            repositoryName="myrepo",
            imageTag="v1",
            imageManifest=manifest.raw.decode(),
            imageManifestMediaType=manifest.media_type,
        )
    assert _error_code(caught.value) == "ImageAlreadyExistsException"
    with pytest.raises(ClientError) as caught:  # an OCI manifest may omit mediaType: ECR then wants one
        client.put_image(repositoryName="myrepo", imageTag="v9", imageManifest=manifest.raw.decode())
    assert _error_code(caught.value) == "InvalidParameterException"
    foreign = dict(layers, layers=[dict(layers["layers"][0], digest="sha256:" + "0" * 64)])
    with pytest.raises(ClientError) as caught:
        client.put_image(
            repositoryName="myrepo",
            imageTag="bad",
            imageManifest=json.dumps(foreign),
            imageManifestMediaType=manifest.media_type,
        )
    assert _error_code(caught.value) == "LayersNotFoundException"

    # a tag moved to another image leaves the old one untagged
    pusher.push("myrepo", "v1", fmt="v2s2")
    untagged = client.describe_images(repositoryName="myrepo", filter={"tagStatus": "UNTAGGED"})
    assert [d["imageDigest"] for d in untagged["imageDetails"]] == [oci]
    assert "imageTags" not in untagged["imageDetails"][0]
    tagged = client.describe_images(repositoryName="myrepo", filter={"tagStatus": "TAGGED"})
    assert [(d["imageDigest"], sorted(d["imageTags"])) for d in tagged["imageDetails"]] == [
        (docker, ["v1", "v2", "v3"])
    ]
    assert client.list_images(repositoryName="myrepo", filter={"tagStatus": "UNTAGGED"})["imageIds"] == [
        {"imageDigest": oci}
    ]

    # pagination, by hand and with botocore's paginator
    page1 = client.describe_images(repositoryName="myrepo", maxResults=1)
    page2 = client.describe_images(repositoryName="myrepo", maxResults=1, nextToken=page1["nextToken"])
    assert "nextToken" not in page2
    assert {page1["imageDetails"][0]["imageDigest"], page2["imageDetails"][0]["imageDigest"]} == {oci, docker}
    pages = client.get_paginator("list_images").paginate(
        repositoryName="myrepo", PaginationConfig={"PageSize": 2}
    )
    assert [len(p["imageIds"]) for p in pages] == [2, 2]
    with pytest.raises(ClientError) as caught:
        client.describe_images(repositoryName="myrepo", imageIds=[{"imageTag": "v1"}], maxResults=1)
    assert _error_code(caught.value) == "InvalidParameterException"

    # batch_delete_image: a tag of an image with others, an untagged image by digest, failures
    deleted = client.batch_delete_image(
        repositoryName="myrepo",
        imageIds=[{"imageTag": "v3"}, {"imageDigest": oci}, {"imageTag": "nope"}, {"imageDigest": "bad"}, {}],
    )
    assert deleted["imageIds"] == [{"imageDigest": docker, "imageTag": "v3"}, {"imageDigest": oci}]
    assert [(f["imageId"], f["failureCode"]) for f in deleted["failures"]] == [
        ({"imageTag": "nope"}, "ImageNotFound"),
        ({"imageDigest": "bad"}, "InvalidImageDigest"),
        ({}, "MissingDigestAndTag"),
    ]
    assert registry.tags("myrepo") == ["v1", "v2"]
    assert registry.manifest("myrepo", oci) is None
    assert [i["imageDigest"] for i in client.list_images(repositoryName="myrepo")["imageIds"]] == [docker] * 2

    # a repository with images is not empty; force deletes them in the registry too
    with pytest.raises(ClientError) as caught:
        client.delete_repository(repositoryName="myrepo")
    assert _error_code(caught.value) == "RepositoryNotEmptyException"
    client.delete_repository(repositoryName="myrepo", force=True)
    assert "myrepo" not in registry.repositories()
    assert registry.manifest("myrepo", docker) is None
    with pytest.raises(ClientError) as caught:
        client.list_images(repositoryName="myrepo")
    assert _error_code(caught.value) == "RepositoryNotFoundException"
    client.create_repository(repositoryName="myrepo")
    assert client.describe_images(repositoryName="myrepo")["imageDetails"] == []
    client.delete_repository(repositoryName="myrepo")  # empty: no force needed


@pytest.mark.integration
def test_image_in_registry_but_not_in_moto(client: Any, registry: LocalRegistry, pusher: Pusher) -> None:
    from botocore.exceptions import ClientError

    _login(client, pusher.authfile)  # whichever test ran first
    pusher.push("orphan", "v1", fmt="v2s2")
    assert "orphan" in registry.repositories()
    for call in (client.describe_images, client.list_images):
        with pytest.raises(ClientError) as caught:
            call(repositoryName="orphan")
        assert _error_code(caught.value) == "RepositoryNotFoundException"
    with pytest.raises(ClientError) as caught:
        client.batch_get_image(repositoryName="orphan", imageIds=[{"imageTag": "v1"}])
    assert _error_code(caught.value) == "RepositoryNotFoundException"


@pytest.mark.integration
def test_index_image(client: Any, registry: LocalRegistry, base_image: str, tmp_path: Path) -> None:
    """A multi-platform image: the index is the tagged image, its platform manifests untagged ones."""
    (tmp_path / "arm.txt").write_text("another platform, a longer layer " * 20)
    with tarfile.open(tmp_path / "arm.tar", "w") as tar:
        tar.add(tmp_path / "arm.txt", arcname="arm.txt")
    suffix = secrets.token_hex(4)
    arm, index = f"localhost/lmforge-ecr-test-arm:{suffix}", f"localhost/lmforge-ecr-test-list:{suffix}"
    _podman("import", "--arch", "arm64", str(tmp_path / "arm.tar"), arm)
    try:
        _podman("manifest", "create", index)
        for image in (base_image, arm):
            _podman("manifest", "add", index, f"containers-storage:{image}")
        client.create_repository(repositoryName="multi/arch")
        _podman(
            "manifest",
            "push",
            "--all",
            "--tls-verify=false",
            index,
            f"docker://{registry.address}/multi/arch:v1",
        )
        details = client.describe_images(repositoryName="multi/arch")["imageDetails"]
        tagged = [d for d in details if d.get("imageTags")]
        children = [d for d in details if not d.get("imageTags")]
        assert len(tagged) == 1
        assert len(children) == 2
        assert tagged[0]["imageTags"] == ["v1"]
        assert tagged[0]["imageManifestMediaType"] in (
            "application/vnd.oci.image.index.v1+json",
            "application/vnd.docker.distribution.manifest.list.v2+json",
        )
        assert "artifactMediaType" not in tagged[0]
        assert tagged[0]["imageSizeInBytes"] == max(c["imageSizeInBytes"] for c in children)
        assert len({c["imageSizeInBytes"] for c in children}) == 2
        client.delete_repository(repositoryName="multi/arch", force=True)
        assert "multi/arch" not in registry.repositories()
    finally:
        _podman("manifest", "rm", index, check=False)
        _podman("rmi", arm, check=False)


@pytest.mark.integration
def test_stopped_registry_is_a_clear_error(client: Any, registry: LocalRegistry, tmp_path: Path) -> None:
    from botocore.exceptions import ClientError

    other = LocalRegistry(tmp_path).start()
    try:
        ecr.install(other)
        client.create_repository(repositoryName="gone")
        assert client.describe_images(repositoryName="gone")["imageDetails"] == []
        other.stop()
        for call in (client.describe_images, client.list_images):
            with pytest.raises(ClientError) as caught:
                call(repositoryName="gone")
            assert _error_code(caught.value) == "ServerException"
            assert "local ECR registry is not running" in str(caught.value)
        with pytest.raises(ClientError) as caught:
            client.get_authorization_token()
        assert "local ECR registry is not running" in str(caught.value)
        assert str(other.log_path) in str(caught.value)
    finally:
        other.stop()
        ecr.install(registry)
        client.delete_repository(repositoryName="gone", force=True)


@pytest.mark.integration
def test_restart_keeps_images_and_stops_a_stale_registry(tmp_path: Path) -> None:
    _need()
    index = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}'
    first = LocalRegistry(tmp_path).start()
    stale = first._proc
    assert stale is not None
    try:
        digest = first.put_manifest("kept", "v1", index, "application/vnd.oci.image.index.v1+json")
        assert digest == "sha256:" + hashlib.sha256(index).hexdigest()
        first._proc = None  # a crashed run: its registry still runs, its pid file is still there
        second = LocalRegistry(tmp_path).start()
        try:
            assert stale.wait(5) is not None  # stopped before the new one started
            assert second._proc is not None
            assert int((tmp_path / "registry" / "registry.pid").read_text()) == second._proc.pid
            info = second.manifest("kept", "v1")  # storage outlives the process
            assert info is not None
            assert (info.digest, info.size, info.media_type) == (digest, 0, OCI_INDEX)
            assert second.manifest_digests("kept") == [digest]
        finally:
            second.stop()
        assert not (tmp_path / "registry" / "registry.pid").exists()
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait()


@pytest.mark.integration
def test_no_registry_is_a_clear_error(moto_url: str, client: Any, registry: LocalRegistry) -> None:
    from botocore.exceptions import ClientError

    try:
        ecr.install(None, unavailable_reason="docker-registry is not installed")
        with pytest.raises(ClientError) as caught:
            client.get_authorization_token()
        assert _error_code(caught.value) == "ServerException"
        assert "local ECR registry is not running: docker-registry is not installed" in str(caught.value)
        # moto's own image calls meanwhile
        client.create_repository(repositoryName="plain")
        assert client.describe_images(repositoryName="plain")["imageDetails"] == []
        client.delete_repository(repositoryName="plain")
    finally:
        ecr.install(registry)
