"""lmforge.container.pip_to_uv: the build's pip.conf as ``uv pip install`` options, as the Dockerfile
runs it (the base image's Python on the secret's path, the output ``eval``-ed by sh)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from lmforge.container import pip_to_uv
from lmforge.container.pipsettings import BuildPipInputs, PipSettings

SCRIPT = Path(pip_to_uv.__file__)


def _through_sh(conf: Path | None) -> tuple[list[str], str]:
    """The positional arguments and UV_HTTP_TIMEOUT a build's shell gets."""
    argv = [sys.executable, str(SCRIPT)] + ([str(conf)] if conf else [])
    snippet = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    out = subprocess.run(
        ["sh", "-c", snippet + 'printf "%s\\n" "$@"; echo "timeout=${UV_HTTP_TIMEOUT-}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return out[:-1], out[-1]


def test_the_builds_own_pip_conf_becomes_the_same_sources_for_uv(tmp_path: Path) -> None:
    links = tmp_path / "wheels"
    links.mkdir()
    settings = PipSettings(
        index_url="https://mirror.example/simple",
        extra_index_urls=["https://extra.example/simple"],
        find_links=[str(links)],
        trusted_hosts=["mirror.example"],
        timeout="180",
    )
    with BuildPipInputs(settings) as inputs:
        conf = next(s for s in inputs.secrets if s.id == "pipconf")
        args, timeout = _through_sh(conf.path)
        served = inputs.server.url
    assert args == [
        "--index-strategy",
        "unsafe-best-match",
        "--index-url",
        "https://mirror.example/simple",
        "--extra-index-url",
        "https://extra.example/simple",
        "--find-links",
        f"{served}/p0/",
        "--allow-insecure-host",
        "mirror.example",
    ]
    assert timeout == "timeout=180"


def test_no_pip_conf_is_uvs_defaults_with_pips_index_strategy(tmp_path: Path) -> None:
    assert _through_sh(None) == (["--index-strategy", "unsafe-best-match"], "timeout=")
    assert _through_sh(tmp_path / "missing.conf") == (["--index-strategy", "unsafe-best-match"], "timeout=")
    empty = tmp_path / "empty.conf"
    empty.write_text("")  # what an image build without the secret mounts
    assert _through_sh(empty)[0] == ["--index-strategy", "unsafe-best-match"]


def test_no_index_several_values_and_the_install_section() -> None:
    text = textwrap.dedent(
        """
        # a comment line, as the marker is
        [global]
        no-index = true
        find-links =
            /wheels/a
            /wheels/b
        [install]
        trusted-host = h1 h2
        """
    )
    args, env = pip_to_uv.uv_settings(text)
    assert args == [
        "--index-strategy",
        "unsafe-best-match",
        "--no-index",
        "--find-links",
        "/wheels/a",
        "--find-links",
        "/wheels/b",
        "--allow-insecure-host",
        "h1",
        "--allow-insecure-host",
        "h2",
    ]
    assert env == {}


def test_a_file_that_is_not_a_pip_conf_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "pip.conf"
    bad.write_text("index-url = https://x\n")  # no section
    proc = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and "is not a pip.conf" in proc.stderr and "Traceback" not in proc.stderr
