"""Container flavours without a container engine: rendered files equal the templates, every Dockerfile
follows the rules, the entrypoint's pieces, the engine/ECR plumbing (against fake podman and docker
clients, named as such), the pip settings handed to a build."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from lmforge.container import engine as engines
from lmforge.container.entrypoint import apply_default_properties, install_requirements
from lmforge.container.flavours import FLAVOURS, FlavourError, image_name, load_flavour
from lmforge.container.render import render_flavour, stale_files

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_files_equal_the_templates() -> None:
    assert stale_files(ROOT) == [], "run: lmforge container render"
    for name in FLAVOURS:
        for filename in ("Dockerfile", "entrypoint.sh", "serving.properties"):
            assert (ROOT / "containers" / name / filename).is_file()
        assert os.access(ROOT / "containers" / name / "entrypoint.sh", os.X_OK)


def test_templates_refuse_missing_settings(tmp_path: Path) -> None:
    import jinja2

    shutil.copytree(ROOT / "templates", tmp_path / "templates")
    shutil.copytree(ROOT / "containers", tmp_path / "containers")
    dockerfile = tmp_path / "templates" / "Dockerfile.j2"
    dockerfile.write_text(dockerfile.read_text() + "\nLABEL x={{ not_a_setting }}\n")
    with pytest.raises(jinja2.UndefinedError):
        render_flavour(load_flavour("cpu", tmp_path), tmp_path)
    (tmp_path / "containers" / "cpu" / "flavour.toml").write_text('description = "x"\n')
    with pytest.raises(FlavourError, match="missing"):
        load_flavour("cpu", tmp_path)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        pending += stripped[:-1] + " " if stripped.endswith("\\") else stripped
        if not stripped.endswith("\\"):
            word, _, rest = pending.partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


@pytest.mark.parametrize("name", FLAVOURS)
def test_dockerfile_rules(name: str) -> None:
    text = (ROOT / "containers" / name / "Dockerfile").read_text()
    steps = _instructions(text)
    args = [a for w, a in steps if w == "ARG"]
    base_arg = [a for a in args if a.startswith("BASE_IMAGE=")]
    assert base_arg, "every Dockerfile takes ARG BASE_IMAGE"
    default_base = base_arg[0].split("=", 1)[1]
    assert re.search(r"@sha256:[0-9a-f]{64}$", default_base), f"base not pinned by digest: {default_base}"
    assert default_base == load_flavour(name, ROOT).base_image
    froms = [a for word, a in steps if word == "FROM"]
    stages = [f.split()[-1] for f in froms if " AS " in f.upper()]
    assert len(stages) >= 2, "multi-stage build"
    for source in (f.split()[0] for f in froms):
        assert source == "${BASE_IMAGE}" or source in stages, f"FROM {source}: only the base or a stage"
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    users = [args for word, args in final if word == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0"), "the final stage must run as a non-root user"
    assert any(word == "HEALTHCHECK" for word, _ in final)
    assert not [a for w, a in steps if w == "ADD"], "no ADD"
    for word, value in steps:
        if word in ("ENV", "ARG"):
            assert not re.search(r"(TOKEN|SECRET|PASSWORD|ACCESS_KEY)\w*=", value), (
                f"secret in {word} {value}"
            )
    runs = " ".join(a for w, a in steps if w == "RUN")
    assert not re.search(r"https?://|--index-url|--extra-index-url|--find-links|--trusted-host", runs), (
        "no package index in a Dockerfile: pip's settings arrive as the pipconf build secret"
    )
    for step in (a for w, a in steps if w == "RUN" and "pip install" in a and "--no-index" not in a):
        assert "--mount=type=secret,id=pipconf" in step and "--mount=type=secret,id=pipca" in step, step
    entry = [args for word, args in final if word == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["/usr/local/bin/lmforge-entrypoint"], "exec-form entrypoint"
    assert ("EXPOSE", "8080") in final
    assert any("accept-bind-to-port=true" in a for w, a in final if w == "LABEL")
    assert ("STOPSIGNAL", "SIGTERM") in final
    for spec in re.findall(r'"([A-Za-z0-9_.\-]+(?:==|>=|<=|~=)?[^"\s]*)"', runs):
        if not spec.startswith("/src["):
            assert "==" in spec, f"unpinned package {spec}"


@pytest.mark.parametrize("name", FLAVOURS)
def test_a_warm_flavour_compiles_only_what_its_start_imports(name: str) -> None:
    """``warm_start``: the dependencies are installed with ``--no-compile`` and the build then starts
    the server once, as root, before the final ``USER``; any other flavour keeps pip's compile. Only
    a flavour whose server runs on the building machine (no GPU) may warm."""
    flavour = load_flavour(name, ROOT)
    steps = _instructions((ROOT / "containers" / name / "Dockerfile").read_text())
    installs = [a for w, a in steps if w == "RUN" and "/tmp/lmforge-deps[" in a]
    warm = [i for i, (w, a) in enumerate(steps) if w == "RUN" and "-m lmforge.container.warm" in a]
    assert len(installs) == 1
    deps = installs[0]
    # uv compiles only when told to; pip unless told not to
    compiles = "--compile-bytecode" in deps if flavour.uv else "--no-compile" not in deps
    if flavour.warm_start:
        assert not flavour.gpu
        assert not compiles
        last_user = max(i for i, (w, _) in enumerate(steps) if w == "USER")
        assert len(warm) == 1 and warm[0] < last_user, "the warm start runs as root, before USER"
    else:
        assert compiles and not warm


@pytest.mark.parametrize("name", FLAVOURS)
def test_a_uv_flavour_installs_its_dependencies_with_uv_from_pips_settings(name: str) -> None:
    """``uv``: the dependency layer comes from ``uv pip install``, with the options
    :mod:`lmforge.container.pip_to_uv` reads from the build's pip.conf secret, and uv (pinned) leaves
    the image in the same step; any other flavour installs them with pip."""
    flavour = load_flavour(name, ROOT)
    steps = _instructions((ROOT / "containers" / name / "Dockerfile").read_text())
    deps = next(a for w, a in steps if w == "RUN" and "/tmp/lmforge-deps[" in a)
    if not flavour.uv:
        assert "uv pip" not in deps and "pip_to_uv" not in deps
        return
    assert re.fullmatch(r"uv==[0-9][0-9.]*", flavour.uv)
    assert "--mount=type=bind,source=src/lmforge/container/pip_to_uv.py,target=/tmp/pip_to_uv.py" in deps
    assert f'pip install --no-compile "{flavour.uv}"' in deps
    settings = deps.index(f'eval "$({flavour.python} /tmp/pip_to_uv.py /run/secrets/pipconf)"')
    install = deps.index("/opt/lmforge/bin/uv pip install --python /opt/lmforge/bin/python --no-cache")
    assert settings < install and '"$@"' in deps[install:]
    assert "export SSL_CERT_FILE=/run/secrets/pipca" in deps
    assert deps.index("/opt/lmforge/bin/pip uninstall -y uv") > install


@pytest.mark.parametrize("name", FLAVOURS)
def test_entrypoint_script_is_valid_sh(name: str) -> None:
    script = ROOT / "containers" / name / "entrypoint.sh"
    subprocess.run(["sh", "-n", str(script)], check=True)
    assert "exec python -m lmforge.container.entrypoint serve" in script.read_text()


def test_entrypoint_runs_other_commands(tmp_path: Path) -> None:
    script = ROOT / "containers" / "cpu" / "entrypoint.sh"
    out = subprocess.run([str(script), "echo", "hello", "world"], capture_output=True, text=True, check=True)
    assert out.stdout == "hello world\n"


def test_default_properties_rank_below_user_env_and_model_file(tmp_path: Path) -> None:
    defaults = tmp_path / "serving.properties"
    defaults.write_text("engine=Python\noption.rolling_batch=vllm\noption.tensor_parallel_degree=max\nx=1\n")
    env = {"OPTION_TENSOR_PARALLEL_DEGREE": "2"}
    applied = apply_default_properties(defaults, env)
    assert applied == ["OPTION_ENGINE", "OPTION_ROLLING_BATCH"]
    assert env == {
        "OPTION_TENSOR_PARALLEL_DEGREE": "2",
        "OPTION_ENGINE": "Python",
        "OPTION_ROLLING_BATCH": "vllm",
    }
    from lmforge.config import load_config

    model = tmp_path / "model"
    model.mkdir()
    (model / "serving.properties").write_text("option.rolling_batch=lmi-dist\n")
    config = load_config(model, env=env).config
    assert config.rolling_batch == "lmi-dist" and config.tensor_parallel_degree == 2
    assert apply_default_properties(tmp_path / "missing", {}) == []


def test_requirements_are_skipped_offline_or_when_not_allowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "requirements.txt").write_text("definitely-not-a-real-package-xyz==1.0\n")
    assert install_requirements(tmp_path, {"HF_HUB_OFFLINE": "1"}) is None
    assert install_requirements(tmp_path, {"LMFORGE_INSTALL_REQUIREMENTS": "false"}) is None
    assert "offline mode" in caplog.text and "LMFORGE_INSTALL_REQUIREMENTS" in caplog.text
    assert install_requirements(tmp_path / "nothing-here", {}) is None


def test_image_names_and_flavour_choice() -> None:
    from lmforge.deploy.images import flavour_for

    assert image_name("vllm") == "lmforge/vllm:" + image_name("vllm").rsplit(":", 1)[1]
    assert image_name("cpu", "1.dkr.ecr.us-east-1.amazonaws.com/team/").startswith(
        "1.dkr.ecr.us-east-1.amazonaws.com/team/lmforge-cpu:"
    )
    assert flavour_for("auto", "ml.g5.2xlarge") == "vllm"
    assert flavour_for("lmi-dist", "ml.m5.xlarge") == "cpu"
    assert flavour_for("vllm", "ml.c5.2xlarge") == "vllm-cpu"
    assert flavour_for("trtllm", None) == "tensorrt-llm"
    assert flavour_for("vllm", "ml.not-a-type") == "vllm"


def _fake_engine(
    tmp_path: Path,
    name: str,
    info_ok: bool,
    buildx: bool = False,
    version: str = "28.2.2",
    folder: str = "bin",
) -> Path:
    """A podman/docker client stand-in (named as such) in ``tmp_path/folder``: logs argv and stdin;
    `info` fails without an engine; `buildx version` answers only when ``buildx``; `--version` says
    ``version`` as docker does."""
    log = tmp_path / f"{name}-{folder}.log"
    script = tmp_path / folder / name
    script.parent.mkdir(exist_ok=True)
    info = 'echo "{}"' if info_ok else 'echo "Cannot connect to the engine" >&2; exit 1'
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = info ]; then {info}; exit 0; fi\n'
        f'if [ "$1" = --version ]; then echo "Docker version {version}, build 0000000"; exit 0; fi\n'
        f'if [ "$1" = buildx ]; then exit {0 if buildx else 1}; fi\n'
        f'echo "ARGV $*" >> {shlex.quote(str(log))}\n'
        f'if [ "$1" = login ]; then echo "STDIN $(cat)" >> {shlex.quote(str(log))}; fi\n'
    )
    script.chmod(0o755)
    return log


def test_engine_detection_prefers_podman_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(engines.ENV_ENGINE, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(engines.EngineError, match="podman: not installed; docker: not installed"):
        engines.detect()
    _fake_engine(tmp_path, "docker", info_ok=False)
    with pytest.raises(engines.EngineError, match="is the Docker daemon running"):
        engines.detect()
    _fake_engine(tmp_path, "podman", info_ok=True)
    assert engines.detect().kind == "podman"
    _fake_engine(tmp_path, "docker", info_ok=True, buildx=True)
    found = engines.detect("docker")
    assert (found.kind, found.builder) == ("docker", "buildx")
    monkeypatch.setenv(engines.ENV_ENGINE, "docker")
    assert engines.detect().kind == "docker"
    with pytest.raises(engines.EngineError, match="unknown container engine"):
        engines.detect("containerd")


def test_build_commands_for_each_engine(tmp_path: Path) -> None:
    secret = engines.Secret("pipconf", tmp_path / "pip.conf")
    req = engines.BuildRequest(
        context=tmp_path,
        dockerfile=tmp_path / "Dockerfile",
        tag="lmforge/cpu:x",
        build_args={"BASE_IMAGE": "localhost/base:1"},
        secrets=[secret],
        network_host=True,
    )
    podman, env = engines.ContainerEngine("podman", "/x/podman").build_command(req)
    assert podman[:3] == ["build", "--format", "docker"] and env == {}  # OCI format drops HEALTHCHECK
    assert f"id=pipconf,src={secret.path}" in podman and podman[-1] == str(tmp_path)
    assert podman[podman.index("--network") : podman.index("--network") + 2] == ["--network", "host"]
    buildx, _ = engines.ContainerEngine("docker", "/x/docker", "buildx").build_command(req)
    assert buildx[:3] == ["buildx", "build", "--load"] and "network.host" in buildx
    classic, env = engines.ContainerEngine("docker", "/x/docker", "buildkit").build_command(req)
    assert classic[0] == "build" and env == {"DOCKER_BUILDKIT": "1"}  # RUN --mount needs BuildKit
    assert "--build-arg" in classic and "BASE_IMAGE=localhost/base:1" in classic


def test_ulimits_stay_under_this_process_hard_limits() -> None:
    import resource

    flags = engines.ulimit_args()
    nofile = int(flags[flags.index("--ulimit") + 1].split("=")[1].split(":")[0])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert nofile <= (hard if hard != resource.RLIM_INFINITY else 65536)


def test_ecr_push_logs_in_where_ecr_says_with_the_password_on_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmforge.container.publish import EcrRepository, push_to_ecr

    log = _fake_engine(tmp_path, "podman", info_ok=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    podman = engines.detect("podman")

    class FakeEcr:  # boto3's ecr client at the AWS boundary (named as such)
        class exceptions:
            class RepositoryNotFoundError(Exception):
                pass

            RepositoryNotFoundException = RepositoryNotFoundError
            ImageNotFoundException = RepositoryNotFoundError

        created: list[str] = []  # noqa: RUF012

        def describe_repositories(self, **kw: object) -> dict[str, object]:
            if not self.created:
                raise self.exceptions.RepositoryNotFoundException()
            return {}

        def create_repository(self, repositoryName: str, **kw: object) -> None:
            self.created.append(repositoryName)

        def get_authorization_token(self, **kw: object) -> dict[str, object]:
            token = base64.b64encode(b"AWS:s3cret-token").decode()
            return {
                "authorizationData": [{"authorizationToken": token, "proxyEndpoint": "http://127.0.0.1:5999"}]
            }

        def describe_images(self, **kw: object) -> dict[str, object]:
            return {"imageDetails": [{"imageTags": ["1.0"]}]}

    notes: list[str] = []
    repo = EcrRepository("123456789012.dkr.ecr.us-west-2.amazonaws.com", "lmforge-cpu")
    uri = push_to_ecr(podman, FakeEcr(), "lmforge/cpu:1.0", repo, "1.0", notes.append)
    assert uri == "123456789012.dkr.ecr.us-west-2.amazonaws.com/lmforge-cpu:1.0"
    assert FakeEcr.created == ["lmforge-cpu"]
    lines = log.read_text().splitlines()
    login = next(i for i, line in enumerate(lines) if line.startswith("ARGV login"))
    assert lines[login] == "ARGV login --tls-verify=false --username AWS --password-stdin 127.0.0.1:5999"
    assert lines[login + 1] == "STDIN s3cret-token"  # the password goes through stdin, never argv
    assert "ARGV tag lmforge/cpu:1.0 127.0.0.1:5999/lmforge-cpu:1.0" in lines
    # the local ECR (plain HTTP on loopback) gets zstd layers; a real registry, gzip (podman's default)
    assert "ARGV push --tls-verify=false --compression-format zstd 127.0.0.1:5999/lmforge-cpu:1.0" in lines
    assert not any("s3cret" in n for n in notes)
    podman.push(
        "123456789012.dkr.ecr.us-west-2.amazonaws.com/lmforge-cpu:1.0", insecure=False, echo=notes.append
    )
    assert (
        log.read_text().splitlines()[-1]
        == "ARGV push 123456789012.dkr.ecr.us-west-2.amazonaws.com/lmforge-cpu:1.0"
    )


def test_pip_settings_become_build_secrets_and_local_folders_are_served(tmp_path: Path) -> None:
    import urllib.parse
    import urllib.request

    from lmforge.container.pipsettings import SECRET_MARKER, BuildPipInputs, PipSettings

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pkg-1.0+cpu-py3-none-any.whl").write_bytes(b"wheel")
    index = tmp_path / "pypi" / "simple" / "pkg"
    index.mkdir(parents=True)
    (index / "index.html").write_text('<a href="../../files/pkg-1.0.whl">pkg-1.0.whl</a>')
    (tmp_path / "pypi" / "files").mkdir()
    (tmp_path / "pypi" / "files" / "pkg-1.0.whl").write_bytes(b"indexed")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    settings = PipSettings(
        extra_index_urls=[f"file://{tmp_path / 'pypi' / 'simple'}", "https://mirror.example/simple"],
        find_links=[str(wheels)],
        cert=str(ca),
        trusted_hosts=["mirror.example"],
    )
    with BuildPipInputs(settings) as inputs:
        assert inputs.network_host
        secrets = {s.id: s.path for s in inputs.secrets}
        conf = secrets["pipconf"].read_text()
        assert inputs.marker.startswith(SECRET_MARKER) and len(inputs.marker) > len(SECRET_MARKER) + 16
        assert inputs.marker in conf and inputs.marker in secrets["pipca"].read_text()
        assert oct(secrets["pipconf"].stat().st_mode)[-3:] == "600"
        lines = dict(line.split(" = ", 1) for line in conf.splitlines() if " = " in line)
        assert "https://mirror.example/simple" in lines["extra-index-url"]
        assert lines["trusted-host"] == "mirror.example"
        served_index = next(u for u in lines["extra-index-url"].split() if u.startswith("http://127.0.0.1"))
        page = urllib.request.urlopen(served_index + "pkg/").read().decode()
        link = page.split('href="')[1].split('"')[0]
        target = urllib.parse.urljoin(served_index + "pkg/", link)  # as pip resolves ../../files/...
        assert urllib.request.urlopen(target).read() == b"indexed"
        listing = urllib.request.urlopen(lines["find-links"]).read().decode()
        assert "pkg-1.0%2Bcpu-py3-none-any.whl" in listing
        with pytest.raises(urllib.error.HTTPError):  # nothing outside the served folders
            urllib.request.urlopen(served_index.rsplit("/", 2)[0] + "/../../../etc/passwd")
    assert not secrets["pipconf"].exists(), "the secrets are removed after the build"


def test_gpu_flavours_are_not_built_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from lmforge.cli import main
    from lmforge.container import build

    monkeypatch.setattr(build, "has_nvidia_gpu", lambda: False)
    for name in ("vllm", "lmi-dist", "tensorrt-llm"):
        result = CliRunner().invoke(main, ["container", "build", name])
        assert result.exit_code == 1, result.output
        assert "for NVIDIA GPUs" in result.output and "lmforge container build cpu" in result.output
        assert "Traceback" not in result.output
    assert build.check_buildable("cpu").gpu is False


def test_the_warm_start_names_a_server_that_exits_before_ping(tmp_path: Path) -> None:
    import subprocess as sp
    import sys
    import time

    from lmforge.container.warm import WarmStartError, _wait_for_ping

    proc = sp.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(WarmStartError, match="exited with code 3 before /ping"):
        _wait_for_ping("http://127.0.0.1:9", proc, time.monotonic() + 30)
