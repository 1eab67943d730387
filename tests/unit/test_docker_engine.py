"""Docker without a network or a buildx plugin: the Dockerfiles need no frontend image from Docker Hub,
the docker CLI that can build is the one used (against fake docker clients, named as such), a CLI that
cannot build says what to install before anything runs, and a daemon without a bridge network is told
apart from one that publishes ports."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from lmforge.container import dockercli
from lmforge.container import engine as engines
from lmforge.container.flavours import FLAVOURS
from tests.unit.test_containers import _fake_engine, _instructions

ROOT = Path(__file__).resolve().parents[2]

#: what the Dockerfile frontend built into Docker 20.10 (BuildKit 0.8, dockerfile 1.2) knows: every
#: instruction, the flags it takes and RUN's mount types. Newer syntax (heredocs, COPY --link or
#: --chmod, RUN --network, HEALTHCHECK --start-interval, ...) needs a `# syntax=` frontend image.
_NO_FLAGS = (
    "ARG",
    "ENV",
    "LABEL",
    "USER",
    "WORKDIR",
    "EXPOSE",
    "STOPSIGNAL",
    "ENTRYPOINT",
    "CMD",
    "VOLUME",
    "SHELL",
)
BUILTIN_FLAGS: dict[str, set[str]] = {
    "FROM": {"platform"},
    "RUN": {"mount"},
    "COPY": {"from", "chown"},
    "ADD": {"chown"},
    "HEALTHCHECK": {"interval", "timeout", "start-period", "retries"},
    **{word: set() for word in _NO_FLAGS},
}
BUILTIN_MOUNTS = {"bind", "cache", "tmpfs", "secret", "ssh"}


@pytest.mark.parametrize("name", FLAVOURS)
def test_dockerfiles_need_no_frontend_image(name: str) -> None:
    text = (ROOT / "containers" / name / "Dockerfile").read_text()
    template = (ROOT / "templates" / "Dockerfile.j2").read_text()
    for source in (text, template):
        assert not re.search(r"(?im)^#\s*syntax\s*=", source), "a `# syntax=` line fetches a frontend image"
    assert "<<" not in text, "heredocs need a newer frontend"
    for word, args in _instructions(text):
        assert word in BUILTIN_FLAGS, f"{word} is unknown to Docker 20.10's built-in frontend"
        # the instruction's own flags lead its arguments (after them: the command and its options)
        for token in itertools.takewhile(lambda t: t.startswith("--"), args.split()):
            flag, _, value = token[2:].partition("=")
            assert flag in BUILTIN_FLAGS[word], f"{word} --{flag} needs a newer frontend"
            if flag == "mount":
                kind = dict(part.partition("=")[::2] for part in value.split(",")).get("type", "bind")
                assert kind in BUILTIN_MOUNTS, f"RUN --mount=type={kind}"


def test_the_docker_cli_that_can_build_is_the_one_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/usr/local/bin/docker 28.x without buildx first on PATH, Debian's 20.10 after it (as here)."""
    monkeypatch.delenv(engines.ENV_ENGINE, raising=False)
    _fake_engine(tmp_path, "docker", info_ok=True, version="28.2.2", folder="new")
    old_log = _fake_engine(tmp_path, "docker", info_ok=True, version="20.10.24+dfsg1", folder="old")
    monkeypatch.setenv("PATH", f"{tmp_path / 'new'}:{tmp_path / 'old'}")
    found = engines.detect("docker")
    assert (found.binary, found.builder, found.client_version) == (
        str(tmp_path / "old" / "docker"),
        "buildkit",
        "20.10.24+dfsg1",
    )
    assert found.passed_over == (f"{tmp_path / 'new' / 'docker'} (28.2.2)",)
    assert "passed over" in found.describe() and "BuildKit" in found.describe()
    found.run_cli(["ps"])
    assert "ARGV ps" in old_log.read_text(), "the chosen CLI runs every command, not only builds"

    # with buildx, the newer CLI builds (and is first on PATH)
    _fake_engine(tmp_path, "docker", info_ok=True, buildx=True, version="28.2.2", folder="new")
    found = engines.detect("docker")
    assert (found.binary, found.builder, found.passed_over) == (
        str(tmp_path / "new" / "docker"),
        "buildx",
        (),
    )


def test_a_docker_cli_that_exits_0_without_a_daemon_does_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker 20.10's `info --format '{{json .}}'` exits 0 with no daemon, and names the error inside."""
    script = tmp_path / "docker"
    answer = '{"ServerErrors":["Cannot connect to the Docker daemon at unix:///x.sock. Is it running?"]}'
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --version ] && echo "Docker version 20.10.24+dfsg1, build 297e128" && exit 0\n'
        f"[ \"$1\" = info ] && echo '{answer}' && exit 0\n"
        "exit 1\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        engines.EngineError, match=r"docker: Cannot connect to the Docker daemon at unix:///x\.sock"
    ):
        engines.detect("docker")


def test_a_docker_cli_that_cannot_build_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _fake_engine(tmp_path, "docker", info_ok=True, version="28.2.2", folder="new")
    monkeypatch.setenv("PATH", str(tmp_path / "new"))
    found = engines.detect("docker")
    assert found.builder == "none", "it still runs, pulls and pushes"
    req = engines.BuildRequest(context=tmp_path, dockerfile=tmp_path / "Dockerfile", tag="t:1")
    with pytest.raises(engines.EngineError) as err:
        found.build(req, echo=lambda _: None)
    message = str(err.value)
    assert "28.2.2" in message and "buildx" in message and "docker-buildx-plugin" in message
    assert "older than 23.0" in message and "/usr/bin/docker" in message and "podman" in message
    assert not log.exists(), "nothing is run that would fail later"


@pytest.mark.parametrize(
    ("text", "version", "builder"),
    [
        ("Docker version 20.10.24+dfsg1, build 297e128", (20, 10, 24), "buildkit"),
        ("Docker version 28.2.2, build e6534b4", (28, 2, 2), "none"),
        ("Docker version 23.0.0, build e92dd87", (23, 0, 0), "none"),
        ("Docker version 18.06.1-ce, build e68fc7a", (18, 6, 1), "none"),
        ("Docker version 18.09.0, build 4d60db4", (18, 9, 0), "buildkit"),
    ],
)
def test_how_each_docker_cli_builds(
    text: str, version: tuple[int, ...], builder: str, tmp_path: Path
) -> None:
    assert dockercli.parse_version(text) == version
    script = tmp_path / "docker"
    script.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "{text}" && exit 0\nexit 1\n')
    script.chmod(0o755)
    cli = dockercli.probe(str(script))
    assert (cli.builder, cli.version) == (builder, text.split()[2].rstrip(","))


def test_publishing_ports_needs_a_bridge_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dockerd --bridge=none has no `bridge` network: a published port would go nowhere."""
    script = tmp_path / "bin" / "docker"
    script.parent.mkdir()
    script.write_text(
        '#!/bin/sh\n[ "$1 $2 $5" = "network inspect bridge" ] && exit "${BRIDGE_RC:-0}"\nexit 0\n'
    )
    script.chmod(0o755)
    docker = engines.ContainerEngine("docker", str(script), "buildkit")
    monkeypatch.setenv("BRIDGE_RC", "0")
    assert docker.publishes_ports()
    monkeypatch.setenv("BRIDGE_RC", "1")
    assert not docker.publishes_ports()
    assert engines.ContainerEngine("podman", str(script)).publishes_ports()
