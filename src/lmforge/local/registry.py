"""A real OCI registry on loopback: the storage behind lmforge's local ECR (:mod:`lmforge.local.ecr`).

:class:`LocalRegistry` runs the CNCF distribution registry (Debian's ``docker-registry`` package, or
any ``registry`` binary of that project) as a child process:

- ``start()`` writes ``STATE_DIR/registry/config.yml`` (filesystem storage under
  ``STATE_DIR/registry/data``, deletes enabled, no auth, ``http.addr`` on loopback with a free port
  when ``port`` is 0), runs ``docker-registry serve CONFIG`` in its own session with its output in
  ``STATE_DIR/registry/registry.log``, writes ``registry.pid`` and returns once ``GET /v2/`` answers
  200 (at most 20 s; otherwise :class:`RegistryError` carries the log's last lines). A registry left
  running by a crashed earlier run on the same state dir is stopped first. The storage outlives the
  process: a restart on the same state dir serves what was pushed before (the port may change).
- ``stop()``: SIGTERM, then SIGKILL after 10 s.
- Clients push plain HTTP: ``podman push --tls-verify=false 127.0.0.1:PORT/REPO:TAG`` (docker treats
  127.0.0.0/8 as insecure by default).

Reads use the Registry HTTP API v2 (stdlib only): :meth:`LocalRegistry.repositories`,
:meth:`~LocalRegistry.tags`, :meth:`~LocalRegistry.manifest`, :meth:`~LocalRegistry.delete_manifest`.
What that API cannot answer comes from the registry's own filesystem storage, which this process
owns: the manifests linked into a repository whether tagged or not (:meth:`~LocalRegistry.manifest_digests`),
when each was pushed (:meth:`~LocalRegistry.pushed_at`), removing one tag while keeping the manifest
(:meth:`~LocalRegistry.untag`; distribution 2.8 has no tag-delete call) and dropping a repository
(:meth:`~LocalRegistry.remove_repository`). Blobs are never garbage-collected here.

The binary: ``$LMFORGE_REGISTRY_BINARY`` when set, else ``docker-registry`` or ``registry`` on PATH.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

BINARY_ENV = "LMFORGE_REGISTRY_BINARY"
BINARY_NAMES = ("docker-registry", "registry")
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_INSTALL_HINT = (
    "install it with `apt-get install docker-registry` (Debian/Ubuntu), put any CNCF distribution "
    f"`registry` binary on PATH, or set {BINARY_ENV} to its path"
)


class RegistryError(RuntimeError):
    """The local registry cannot be started, or did not answer as expected.

    ``status`` and ``codes`` (the registry's error codes, e.g. ``MANIFEST_BLOB_UNKNOWN``) are set when
    the registry answered with an HTTP error.
    """

    def __init__(self, message: str, status: int | None = None, codes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.codes = codes


@dataclass(frozen=True)
class ManifestInfo:
    """A manifest as the registry serves it."""

    digest: str
    media_type: str
    raw: bytes
    size: int
    """Bytes of the image: its layers plus its config; for an index, the largest of its manifests."""

    def json(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.raw)
        return loaded


def find_registry_binary() -> str | None:
    """The registry binary to run: ``$LMFORGE_REGISTRY_BINARY``, else ``docker-registry``/``registry``."""
    configured = os.environ.get(BINARY_ENV)
    if configured:
        return shutil.which(configured)
    for name in BINARY_NAMES:
        if found := shutil.which(name):
            return found
    return None


def missing_binary_message() -> str:
    """What to tell a user who has no registry binary."""
    configured = os.environ.get(BINARY_ENV)
    if configured:
        return f"{BINARY_ENV}={configured} is not an executable file; {_INSTALL_HINT}"
    return f"no OCI registry binary (docker-registry or registry) on PATH; {_INSTALL_HINT}"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _port_problem(host: str, port: int) -> str | None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _check_repo(repo: str) -> str:
    # the name goes into URLs and storage paths: keep to what a registry accepts, no "..", no "/" ends
    if not re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*", repo):
        raise ValueError(f"invalid repository name {repo!r}")
    return repo


class LocalRegistry:
    """A CNCF distribution registry, run as a child process on ``host`` (loopback)."""

    def __init__(self, state_dir: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.host = host
        self.port = port
        self.dir = self.state_dir / "registry"
        self.config_path = self.dir / "config.yml"
        self.log_path = self.dir / "registry.log"
        self.pid_path = self.dir / "registry.pid"
        self.data_dir = self.dir / "data"
        self._proc: subprocess.Popen[bytes] | None = None
        self._bound_port = port

    # ---- process ----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``HOST:PORT``, the registry part of an image name pushed here."""
        return f"{self.host}:{self._bound_port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalRegistry:
        """Start the registry (no-op when this object's registry is already running)."""
        if self.running:
            return self
        binary = find_registry_binary()
        if binary is None:
            raise RegistryError(missing_binary_message())
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._stop_stale()
        attempts = 3 if self.port == 0 else 1  # a free port can be taken between choosing and binding
        for attempt in range(attempts):
            self._bound_port = self.port or _free_port(self.host)
            if problem := _port_problem(self.host, self._bound_port):
                # another server there would answer /v2/ in our registry's place
                raise RegistryError(f"the registry cannot listen on {self.address}: {problem}")
            self._write_config()
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    [binary, "serve", str(self.config_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.pid_path.write_text(f"{self._proc.pid}\n")
            try:
                self._wait_ready()
                return self
            except RegistryError:
                self.stop()
                busy = "address already in use" in _log_tail(self.log_path, 5)
                if not busy or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; removes the pid file."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.pid_path.unlink(missing_ok=True)

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _write_config(self) -> None:
        # YAML by hand: paths are JSON-quoted (JSON strings are valid YAML scalars)
        self.config_path.write_text(
            "version: 0.1\n"
            "log:\n"
            "  level: warn\n"
            "  accesslog:\n"
            "    disabled: true\n"
            "storage:\n"
            "  filesystem:\n"
            f"    rootdirectory: {json.dumps(str(self.data_dir))}\n"
            "  delete:\n"
            "    enabled: true\n"
            "http:\n"
            f"  addr: {json.dumps(self.address)}\n"
            f"  secret: {secrets.token_hex(16)}\n"
            "  headers:\n"
            "    X-Content-Type-Options: [nosniff]\n"
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise RegistryError(
                    f"the registry exited with status {code} at start; {self.log_path}:\n"
                    f"{_log_tail(self.log_path)}"
                )
            try:
                status, _, _ = self._request("GET", "/v2/", timeout=1.0)
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RegistryError(
                    f"the registry did not answer GET {self.url}/v2/ within {START_TIMEOUT_S:.0f} s; "
                    f"{self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(0.05)

    def _stop_stale(self) -> None:
        """Stop a registry a crashed earlier run left on this state dir (its pid file names it)."""
        try:
            pid = int(self.pid_path.read_text().strip())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            self.pid_path.unlink(missing_ok=True)
            return
        name = os.path.basename(argv[0].decode(errors="replace"))
        names = {*BINARY_NAMES, os.path.basename(find_registry_binary() or "registry")}
        ours = name in names and str(self.config_path).encode() in argv
        if ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
        self.pid_path.unlink(missing_ok=True)

    # ---- Registry HTTP API v2 -----------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        conn = http.client.HTTPConnection(self.host, self._bound_port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.headers, response.read()
        finally:
            conn.close()

    def _api(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        try:
            return self._request(method, path, headers, body)
        except OSError as exc:
            raise RegistryError(f"the local registry at {self.url} is not answering: {exc}") from exc

    def _paged(self, path: str, key: str) -> list[str]:
        """Follow ``Link: <...>; rel="next"`` pages; [] when the registry answers 404."""
        out: list[str] = []
        next_path: str | None = path
        while next_path:
            status, headers, body = self._api("GET", next_path)
            if status == 404:
                return []
            if status != 200:
                raise _api_error(f"GET {next_path}", status, body)
            out.extend(json.loads(body).get(key) or [])
            link = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', headers.get("Link", ""))
            next_path = link.group(1) if link else None
        return out

    def repositories(self) -> list[str]:
        """The registry's catalog (``/v2/_catalog``): repositories that hold layers."""
        return sorted(self._paged("/v2/_catalog?n=1000", "repositories"))

    def tags(self, repo: str) -> list[str]:
        """The tags of ``repo``; [] when the repository is unknown."""
        return sorted(self._paged(f"/v2/{_check_repo(repo)}/tags/list?n=1000", "tags"))

    def manifest(self, repo: str, reference: str) -> ManifestInfo | None:
        """The manifest ``repo:reference`` (a tag or a digest), or None when there is none."""
        path = f"/v2/{_check_repo(repo)}/manifests/{quote(reference, safe=':')}"
        status, headers, body = self._api("GET", path, {"Accept": ", ".join(MANIFEST_TYPES)})
        if status == 404:
            return None
        if status != 200:
            raise _api_error(f"GET {path}", status, body)
        document = json.loads(body)
        media_type = document.get("mediaType") or headers.get_content_type()
        digest = headers.get("Docker-Content-Digest") or _sha256(body)
        if media_type in INDEX_TYPES:
            sizes = [
                child.size
                for entry in document.get("manifests") or []
                if _DIGEST.fullmatch(str(entry.get("digest")))
                and (child := self.manifest(repo, entry["digest"])) is not None
            ]
            size = max(sizes, default=0)
        else:
            config = document.get("config") or {}
            size = int(config.get("size") or 0) + sum(
                int(layer.get("size") or 0) for layer in document.get("layers") or []
            )
        return ManifestInfo(digest=digest, media_type=media_type, raw=body, size=size)

    def put_manifest(self, repo: str, reference: str, raw: bytes, media_type: str) -> str:
        """Store ``raw`` as ``repo:reference`` (a tag, or its own digest); returns its digest.

        Raises :class:`RegistryError` with the registry's error ``codes`` when it refuses (for example
        ``MANIFEST_BLOB_UNKNOWN`` when a layer or the config is not in the repository).
        """
        path = f"/v2/{_check_repo(repo)}/manifests/{quote(reference, safe=':')}"
        status, headers, body = self._api("PUT", path, {"Content-Type": media_type}, raw)
        if status in (200, 201):
            return headers.get("Docker-Content-Digest") or _sha256(raw)
        raise _api_error(f"PUT {path}", status, body)

    def delete_manifest(self, repo: str, digest: str) -> bool:
        """Delete a manifest (and every tag on it); False when it was not there."""
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        path = f"/v2/{_check_repo(repo)}/manifests/{digest}"
        status, _, body = self._api("DELETE", path)
        if status in (200, 202):
            return True
        if status == 404:
            return False
        raise _api_error(f"DELETE {path}", status, body)

    # ---- the registry's filesystem storage (ours: under state_dir) ------------------------------

    def _repo_dir(self, repo: str) -> Path:
        return self.data_dir / "docker" / "registry" / "v2" / "repositories" / _check_repo(repo)

    def manifest_digests(self, repo: str) -> list[str]:
        """Every manifest linked into ``repo``, tagged or not (the API can list only tags)."""
        revisions = self._repo_dir(repo) / "_manifests" / "revisions" / "sha256"
        try:
            entries = list(revisions.iterdir())
        except OSError:
            return []
        return sorted(f"sha256:{e.name}" for e in entries if (e / "link").is_file())

    def pushed_at(self, repo: str, digest: str) -> datetime | None:
        """When ``digest`` was linked into ``repo`` (or its blob written), from the storage's mtimes."""
        algorithm, _, hex_digest = digest.partition(":")
        candidates = (
            self._repo_dir(repo) / "_manifests" / "revisions" / algorithm / hex_digest / "link",
            self.data_dir / "docker/registry/v2/blobs" / algorithm / hex_digest[:2] / hex_digest / "data",
        )
        for path in candidates:
            with contextlib.suppress(OSError):
                return datetime.fromtimestamp(path.stat().st_mtime, UTC)
        return None

    def untag(self, repo: str, tag: str) -> bool:
        """Remove one tag, keeping its manifest; False when there was no such tag."""
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", tag):
            return False
        tag_dir = self._repo_dir(repo) / "_manifests" / "tags" / tag
        if not tag_dir.is_dir():
            return False
        shutil.rmtree(tag_dir)
        return True

    def remove_repository(self, repo: str) -> int:
        """Delete every manifest of ``repo`` and drop it from the catalog; returns how many manifests."""
        deleted = sum(self.delete_manifest(repo, digest) for digest in self.manifest_digests(repo))
        shutil.rmtree(self._repo_dir(repo), ignore_errors=True)
        return deleted


def _api_error(what: str, status: int, body: bytes) -> RegistryError:
    codes: list[str] = []
    messages: list[str] = []
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        for error in json.loads(body).get("errors") or []:
            codes.append(str(error.get("code")))
            detail = error.get("detail")
            messages.append(
                f"{error.get('code')}: {error.get('message')}" + (f" ({detail})" if detail else "")
            )
    text = "; ".join(messages) or repr(body[:500])
    return RegistryError(f"{what}: HTTP {status}: {text}", status=status, codes=tuple(codes))


def _sha256(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
