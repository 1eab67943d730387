"""The container engine that builds, pushes and runs lmforge's images: podman or docker.

``detect()`` picks one: ``--engine`` / ``$LMFORGE_CONTAINER_ENGINE`` when given, else podman when it
answers (daemonless, so it works wherever its binary does), else docker when its daemon answers.
Everything goes through the engine's command line; nothing here imports a client library.

Both speak the same build language: multi-stage Dockerfiles with ``RUN --mount=type=secret``.
docker needs BuildKit for that: ``docker buildx build`` when the buildx plugin is there, else
``docker build`` with ``DOCKER_BUILDKIT=1`` on a CLI older than 23.0, whose ``build`` drives the
daemon's own BuildKit (Debian bookworm's docker.io 20.10). A newer CLI without buildx has no way to
BuildKit at all, so of the docker CLIs on ``PATH`` the first that can build is used; when none can,
the engine still runs, pulls and pushes, and a build stops with what to install. podman builds with
``--format docker`` because the OCI image format has no HEALTHCHECK.

Containers started here get explicit ``--ulimit nofile``/``nproc`` values at or under this process's
hard limits: both engines otherwise raise them, which fails where the engine lacks
CAP_SYS_RESOURCE (rootless, or a sandbox).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmforge.container import dockercli
from lmforge.container.dockercli import Builder

Echo = Callable[[str], None]
EngineKind = Literal["podman", "docker"]
ENGINES: tuple[EngineKind, ...] = ("podman", "docker")
ENV_ENGINE = "LMFORGE_CONTAINER_ENGINE"
#: stages podman builds at once (the images' s5cmd, wheel and runtime stages only need the base)
PODMAN_BUILD_JOBS = 2
_INFO_TIMEOUT_S = 20.0

INSTALL_HINT = (
    "install podman (Debian/Ubuntu: apt-get install podman buildah runc) or Docker with BuildKit (buildx, "
    "or Debian bookworm's docker.io, whose 20.10 CLI has it), "
    "or set LMFORGE_CONTAINER_ENGINE to the one you have"
)


class EngineError(Exception):
    """No usable engine, or an engine command that failed; the message says what to do."""


@dataclass(frozen=True)
class Secret:
    """A build secret: mounted at ``/run/secrets/<id>`` for the RUN steps that ask for it only."""

    id: str
    path: Path


@dataclass(frozen=True)
class BuildRequest:
    context: Path
    dockerfile: Path
    tag: str
    build_args: Mapping[str, str] = field(default_factory=dict)
    secrets: Sequence[Secret] = ()
    network_host: bool = False
    """RUN steps share the host's network (to reach a package server on loopback)."""
    no_cache: bool = False
    platform: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerEngine:
    kind: EngineKind
    binary: str
    builder: Builder = "podman"
    global_args: tuple[str, ...] = ()
    """Put before every command (podman's ``--root``/``--runroot`` for a separate image store)."""
    client_version: str = ""
    """docker only: the CLI's version (``docker --version``)."""
    passed_over: tuple[str, ...] = ()
    """docker only: CLIs earlier on PATH that could not build (``path (version)``), to say why not."""

    def with_store(self, root: Path) -> ContainerEngine:
        """The same podman with its own image store under ``root`` (empty: no cached layers)."""
        if self.kind != "podman":
            raise EngineError("a separate image store needs podman")
        args = ("--root", str(root / "storage"), "--runroot", str(root / "run"))
        return dataclasses.replace(self, global_args=args)

    def describe(self) -> str:
        """``kind (binary ...)``: which CLI runs, and for docker, how it builds."""
        if self.kind == "podman":
            return f"podman ({self.binary})"
        how = {
            "buildx": "builds with buildx",
            "buildkit": "builds with the daemon's BuildKit (DOCKER_BUILDKIT=1)",
            "none": "cannot build: no buildx",
        }[self.builder]
        over = f"; passed over {', '.join(self.passed_over)}: no buildx" if self.passed_over else ""
        return f"docker ({self.binary} {self.client_version or '?'}, {how}{over})"

    def check_can_build(self) -> None:
        """EngineError saying what to install when this engine cannot build lmforge's Dockerfiles."""
        if self.builder != "none":
            return
        raise EngineError(
            f"the docker CLI {self.binary} ({self.client_version or 'unknown version'}) builds with BuildKit "
            "only through the buildx plugin, which is not installed (`docker buildx version` fails), and "
            "lmforge's Dockerfiles need BuildKit (RUN --mount=type=secret). Install buildx (Docker's apt "
            "repository: docker-buildx-plugin; or the docker-buildx binary of "
            "https://github.com/docker/buildx/releases as ~/.docker/cli-plugins/docker-buildx), or put a "
            "docker CLI older than 23.0 first on PATH, whose `docker build` has BuildKit built in (Debian "
            "bookworm's docker.io 20.10: /usr/bin/docker), or build with podman (--engine podman)"
        )

    # ----- commands
    def _run(
        self,
        args: Sequence[str],
        *,
        echo: Echo | None = None,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
        capture: bool = True,
        timeout: float | None = None,
        what: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = self.argv(*args)
        if echo is not None:
            echo("$ " + " ".join(cmd))
        try:
            proc = subprocess.run(
                cmd,
                input=stdin,
                text=True,
                capture_output=capture,
                env=None if env is None else {**os.environ, **env},
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise EngineError(f"{self.kind} {args[0]} did not finish within {timeout:.0f} s") from None
        if what is not None and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout or "").strip() if capture else ""
            last = "\n".join(detail.splitlines()[-6:])
            raise EngineError(
                f"{what} failed ({self.kind} exit code {proc.returncode})" + (f":\n{last}" if last else "")
            )
        return proc

    def run_cli(self, args: Sequence[str], *, what: str | None = None) -> subprocess.CompletedProcess[str]:
        """Any engine command (captured); EngineError naming ``what`` when it fails."""
        return self._run(args, what=what)

    def version(self) -> str:
        proc = self._run(["version", "--format", "{{.Client.Version}}"])
        return proc.stdout.strip() or "unknown"

    # ----- build and images
    def build_command(self, req: BuildRequest) -> tuple[list[str], dict[str, str]]:
        """The argv (without the binary) and extra environment for one build."""
        env: dict[str, str] = {}
        if self.kind == "podman":
            # --jobs: the stages that do not need each other (s5cmd, lmforge's wheel, the dependencies)
            # build two at a time, as BuildKit does by default: 77 s against 94-96 s for a cold cpu build
            # here (3 at a time: 82 s)
            args = ["build", "--format", "docker", "--pull=missing", "--jobs", str(PODMAN_BUILD_JOBS)]
        elif self.builder == "buildx":
            args = ["buildx", "build", "--load"]
        else:
            args = ["build"]
            env["DOCKER_BUILDKIT"] = "1"
        args += ["--file", str(req.dockerfile), "--tag", req.tag]
        for key, value in req.build_args.items():
            args += ["--build-arg", f"{key}={value}"]
        for key, value in req.labels.items():
            args += ["--label", f"{key}={value}"]
        for secret in req.secrets:
            args += ["--secret", f"id={secret.id},src={secret.path}"]
        if req.network_host:
            args += ["--network", "host"]
            if self.builder == "buildx":
                args += ["--allow", "network.host"]
        if req.no_cache:
            args.append("--no-cache")
        if req.platform:
            args += ["--platform", req.platform]
        args.append(str(req.context))
        return args, env

    def build(self, req: BuildRequest, echo: Echo) -> None:
        self.check_can_build()
        args, env = self.build_command(req)
        # the build's own output goes straight to the terminal (stderr): it is the progress
        self._run(args, echo=echo, env=env, capture=False, what=f"building {req.tag}")

    def image_exists(self, ref: str) -> bool:
        if self.kind == "podman":
            return self._run(["image", "exists", ref]).returncode == 0
        return self._run(["image", "inspect", "--format", "{{.Id}}", ref]).returncode == 0

    def inspect_image(self, ref: str) -> dict[str, Any]:
        proc = self._run(["image", "inspect", ref], what=f"inspecting {ref}")
        data = json.loads(proc.stdout)
        return dict(data[0]) if isinstance(data, list) else dict(data)

    def image_size(self, ref: str) -> int:
        return int(self.inspect_image(ref).get("Size") or 0)

    def tag(self, src: str, dst: str, echo: Echo | None = None) -> None:
        self._run(["tag", src, dst], echo=echo, what=f"tagging {src} as {dst}")

    def untag(self, ref: str) -> None:
        """Drop the name ``ref`` (the image stays under its other names)."""
        # `podman untag IMAGE` alone drops every name of the image: name the one to drop
        self._run(["untag", ref, ref] if self.kind == "podman" else ["rmi", ref])

    def save(self, ref: str, path: Path) -> None:
        """The image as a docker-archive tarball (every layer) at ``path``."""
        self._run(["save", "--output", str(path), ref], what=f"saving {ref}")

    def import_rootfs(self, tarball: Path, ref: str, changes: Sequence[str] = ()) -> None:
        args = ["import"]
        for change in changes:
            args += ["--change", change]
        self._run([*args, str(tarball), ref], what=f"importing {tarball} as {ref}")

    def _tls(self, insecure: bool) -> list[str]:
        # docker trusts registries on loopback over plain HTTP by itself; podman must be told
        return ["--tls-verify=false"] if insecure and self.kind == "podman" else []

    def login(self, registry: str, username: str, password: str, *, insecure: bool, echo: Echo) -> None:
        """Log in with the password on stdin (never in argv, where ``ps`` would show it)."""
        args = ["login", *self._tls(insecure), "--username", username, "--password-stdin", registry]
        self._run(args, echo=echo, stdin=password, what=f"logging in to {registry}")

    def push(self, ref: str, *, insecure: bool, echo: Echo) -> None:
        """Push ``ref``. To a registry on loopback (the local ECR), podman compresses the layers with
        zstd rather than gzip: the same image (same layers and config once decompressed, so the same
        image id), at a fraction of the CPU (about 20 CPU-s of gzip for the 1.2 GB cpu image here)
        for bytes that never leave the machine. A real registry gets gzip, which every runtime reads."""
        args = ["push", *self._tls(insecure)]
        if insecure and self.kind == "podman":
            args += ["--compression-format", "zstd"]
        self._run([*args, ref], echo=echo, capture=False, what=f"pushing {ref}")

    def pull(self, ref: str, *, insecure: bool, timeout: float | None = None) -> None:
        args = ["pull", *self._tls(insecure)]
        if self.kind == "podman":
            args.append("--quiet")
        self._run([*args, ref], timeout=timeout, what=f"pulling {ref}")

    def healthcheck(self, container: str) -> bool:
        """Run the image's HEALTHCHECK once in ``container`` (podman); True when it passes."""
        if self.kind != "podman":
            raise EngineError("healthcheck run needs podman")
        return self._run(["healthcheck", "run", container]).returncode == 0

    # ----- containers
    def argv(self, *args: str) -> list[str]:
        """The full command line of ``args`` (binary and global arguments first)."""
        return [self.binary, *self.global_args, *args]

    def run_args(self) -> list[str]:
        """``run`` with ulimits this process may grant."""
        return ["run", *ulimit_args()]

    def publishes_ports(self) -> bool:
        """Whether ``run --publish`` reaches the container: podman's network always does; a Docker
        daemon started with ``--bridge=none`` (no private-range network, as lmforge's CI runs it) has
        no ``bridge`` network, and its containers' published ports go nowhere, silently."""
        if self.kind == "podman":
            return True
        found = self._run(["network", "inspect", "--format", "{{.Name}}", "bridge"], timeout=30)
        return found.returncode == 0

    def stop(self, name: str, timeout_s: int) -> None:
        self._run(["stop", "--time", str(timeout_s), name], timeout=timeout_s + 30)

    def remove_container(self, name: str) -> None:
        self._run(["rm", "--force", name], timeout=60)

    def containers(self, label: str) -> list[str]:
        """Names of containers (running or not) that carry ``label`` (``key=value``)."""
        proc = self._run(["ps", "--all", "--filter", f"label={label}", "--format", "{{.Names}}"])
        return [line.strip() for line in proc.stdout.splitlines() if line.strip()]

    def container_state(self, name: str) -> dict[str, Any] | None:
        proc = self._run(["inspect", "--type", "container", "--format", "{{json .State}}", name])
        if proc.returncode != 0:
            return None
        try:
            state = json.loads(proc.stdout)
        except ValueError:
            return None
        return dict(state) if isinstance(state, dict) else None


def ulimit_args() -> list[str]:
    """``--ulimit`` flags at or under this process's hard limits (nofile capped at 65536)."""
    out = []
    for name, limit, cap in (
        ("nofile", resource.RLIMIT_NOFILE, 65536),
        ("nproc", resource.RLIMIT_NPROC, 32768),
    ):
        _, hard = resource.getrlimit(limit)
        value = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        out += ["--ulimit", f"{name}={value}:{value}"]
    return out


def _answers(binary: str) -> tuple[bool, str]:
    try:
        proc = subprocess.run(
            [binary, "info", "--format", "{{json .}}"],
            capture_output=True,
            text=True,
            timeout=_INFO_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if proc.returncode != 0 or not proc.stdout.strip():
        return False, (proc.stderr.strip().splitlines() or ["no answer"])[-1]
    # a docker CLI before 23.0 exits 0 with no daemon, and says so in the JSON
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        return True, ""
    errors = info.get("ServerErrors") if isinstance(info, dict) else None
    if errors:
        return False, str(errors[-1])
    return True, ""


def _docker(problems: list[str]) -> ContainerEngine | None:
    """docker through the first CLI on PATH that can build, else the first CLI (it runs, pulls and
    pushes; a build then says what to install); None (and why in ``problems``) when none answers."""
    paths = dockercli.on_path()
    if not paths:
        problems.append("docker: not installed")
        return None
    cli, passed = dockercli.choose([dockercli.probe(path) for path in paths])
    ok, why = _answers(cli.path)
    if not ok:
        hint = " (is the Docker daemon running?)" if "running" not in why else ""
        problems.append(f"docker: {why}{hint}")
        return None
    return ContainerEngine("docker", cli.path, cli.builder, (), cli.version, tuple(c.label() for c in passed))


def detect(preferred: str | None = None) -> ContainerEngine:
    """The engine to use: ``preferred`` (or ``$LMFORGE_CONTAINER_ENGINE``), else podman, else docker."""
    choice = (preferred or os.environ.get(ENV_ENGINE) or "auto").strip().lower()
    if choice not in ("auto", *ENGINES):
        raise EngineError(f"unknown container engine {choice!r}; choose auto, podman or docker")
    candidates: tuple[EngineKind, ...] = ENGINES if choice == "auto" else (choice,)  # type: ignore[assignment]
    problems: list[str] = []
    for kind in candidates:
        if kind == "docker":
            found = _docker(problems)
            if found is not None:
                return found
            continue
        binary = shutil.which(kind)
        if binary is None:
            problems.append(f"{kind}: not installed")
            continue
        ok, why = _answers(binary)
        if not ok:
            problems.append(f"{kind}: {why}")
            continue
        return ContainerEngine(kind, binary)
    raise EngineError("no container engine answers (" + "; ".join(problems) + "): " + INSTALL_HINT)


def available(preferred: str | None = None) -> ContainerEngine | None:
    try:
        return detect(preferred)
    except EngineError:
        return None


def wait_until(predicate: Callable[[], bool], timeout_s: float, every_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return predicate()
