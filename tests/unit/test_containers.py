"""Container flavours without a Docker engine: rendered files equal the templates, every Dockerfile
follows the rules, the entrypoint's pieces, the docker/ECR plumbing (against a fake docker client)."""

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

from lmforge.container import docker
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
    froms = [args for word, args in steps if word == "FROM"]
    assert len([f for f in froms if " AS " in f.upper()]) >= 2, "multi-stage build"
    for image in (f.split()[0] for f in froms):
        assert re.search(r":[\w.-]+$", image) or "@sha256:" in image, f"unpinned base {image}"
        assert not image.endswith(":latest"), image
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    users = [args for word, args in final if word == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0"), "the final stage must run as a non-root user"
    assert any(word == "HEALTHCHECK" for word, _ in final)
    assert not [a for w, a in steps if w == "ADD" and re.search(r"https?://", a)], "no ADD of URLs"
    for word, args in steps:
        if word in ("ENV", "ARG"):
            assert not re.search(r"(TOKEN|SECRET|PASSWORD|ACCESS_KEY)\w*=", args), f"secret in {word} {args}"
    entry = [args for word, args in final if word == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["/usr/local/bin/lmforge-entrypoint"], "exec-form entrypoint"
    assert ("EXPOSE", "8080") in final
    assert any("accept-bind-to-port=true" in a for w, a in final if w == "LABEL")
    assert ("STOPSIGNAL", "SIGTERM") in final
    runs = " ".join(a for w, a in steps if w == "RUN")
    for spec in re.findall(r'"([A-Za-z0-9_.\-]+(?:==|>=|<=|~=)?[^"\s]*)"', runs):
        if not spec.startswith("/src["):
            assert "==" in spec, f"unpinned package {spec}"
    flavour = load_flavour(name, ROOT)
    assert flavour.base_image in froms[1]


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
    from lmforge.cli.container_cmd import flavour_for

    assert image_name("vllm") == "lmforge/vllm:" + image_name("vllm").rsplit(":", 1)[1]
    assert image_name("cpu", "1.dkr.ecr.us-east-1.amazonaws.com/team/").startswith(
        "1.dkr.ecr.us-east-1.amazonaws.com/team/lmforge-cpu:"
    )
    assert flavour_for("auto", "ml.g5.2xlarge") == "vllm"
    assert flavour_for("lmi-dist", "ml.m5.xlarge") == "cpu"
    assert flavour_for("trtllm", None) == "tensorrt-llm"
    assert flavour_for("vllm", "ml.not-a-type") == "vllm"


def _fake_docker(tmp_path: Path, info_ok: bool) -> Path:
    """A docker client stand-in (named as such): logs argv and stdin; `info` fails without an engine."""
    log = tmp_path / "docker.log"
    script = tmp_path / "bin" / "docker"
    script.parent.mkdir()
    info = "echo 27.0.1" if info_ok else 'echo "Cannot connect to the Docker daemon" >&2; exit 1'
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = info ]; then {info}; exit 0; fi\n'
        f'echo "ARGV $*" >> {shlex.quote(str(log))}\n'
        f'if [ "$1" = login ]; then echo "STDIN $(cat)" >> {shlex.quote(str(log))}; fi\n'
    )
    script.chmod(0o755)
    return log


def test_docker_without_an_engine_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_docker(tmp_path, info_ok=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    with pytest.raises(docker.DockerError, match="no Docker engine is running"):
        docker.check_engine()
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(docker.DockerError, match="not installed"):
        docker.check_engine()


def test_build_and_ecr_push_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _fake_docker(tmp_path, info_ok=True)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    binary = docker.check_engine()
    cmd = docker.build_command(binary, ROOT, "cpu", "lmforge/cpu:x", "linux/amd64", push=False)
    assert cmd[1:4] == ["buildx", "build", "--file"] and cmd[-1] == str(ROOT) and "--load" in cmd

    class FakeEcr:  # boto3's ecr client at the AWS boundary
        def get_authorization_token(self) -> dict[str, object]:
            token = base64.b64encode(b"AWS:s3cret-token").decode()
            return {"authorizationData": [{"authorizationToken": token}]}

    notes: list[str] = []
    docker.ecr_login(
        binary, "123456789012.dkr.ecr.us-west-2.amazonaws.com/lmforge", notes.append, ecr=FakeEcr()
    )
    lines = log.read_text().splitlines()
    assert (
        lines[0] == "ARGV login --username AWS --password-stdin 123456789012.dkr.ecr.us-west-2.amazonaws.com"
    )
    assert lines[1] == "STDIN s3cret-token"  # the password goes through stdin, never argv
    assert not any("s3cret" in n for n in notes)
