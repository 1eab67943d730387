"""The building machine's pip settings, handed to the pip inside an image build.

pip inside ``docker build``/``podman build`` knows nothing of the machine it runs on: not its index,
extra indexes, find-links folders or the CA bundle its proxy needs. :func:`read_pip_settings` reads
them the way pip does (``pip config list``: the global, user and site files, then ``PIP_*``
variables), and :class:`BuildPipInputs` turns them into two build secrets, ``pipconf`` (a pip.conf)
and ``pipca`` (the CA bundle), which the Dockerfiles mount into the RUN steps that run pip only, so
they never reach a layer. Both files carry a marker line (:data:`SECRET_MARKER` and a random token
per build, :attr:`BuildPipInputs.marker`), which a test looks for in every layer of a built image.

Local sources (a find-links folder, a ``file://`` index) cannot be mounted generically into a build,
so they are served read-only over HTTP on loopback for the length of the build
(:class:`LocalPackageServer`); the build's RUN steps then share the host's network. A ``file://``
index is served from the folder above it, so that links such as ``../../files/x.whl`` resolve.
Indexes a flavour names for its pinned wheels (PyTorch's CPU index) are added when they answer.
"""

from __future__ import annotations

import functools
import http.server
import os
import secrets
import shlex
import ssl
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import ClassVar

from lmforge.container.engine import Secret

SECRET_MARKER = "lmforge-build-secret"
_LIST_KEYS = ("extra-index-url", "find-links", "trusted-host")
_KEYS = ("index-url", "no-index", "cert", "default-timeout", "timeout", "retries", *_LIST_KEYS)
_SYSTEM_CA = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")


@dataclass
class PipSettings:
    index_url: str | None = None
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    trusted_hosts: list[str] = field(default_factory=list)
    no_index: bool = False
    cert: str | None = None
    timeout: str | None = None
    retries: str | None = None


def read_pip_settings(python: str = sys.executable, env: Mapping[str, str] | None = None) -> PipSettings:
    """pip's effective settings on this machine (config files, then ``PIP_*``), as ``pip`` sees them."""
    environ = dict(os.environ if env is None else env)
    values: dict[str, str] = {}
    try:
        proc = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, env=environ, timeout=60
        )
        lines = proc.stdout.splitlines() if proc.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        lines = []
    # later lines win: pip lists the files in its own load order, then the environment (":env:")
    ranked: list[tuple[int, str, str]] = []
    for line in lines:
        name, sep, raw = line.partition("=")
        if not sep:
            continue
        section, _, key = name.rpartition(".")
        if key not in _KEYS or section not in ("global", "install", "download", ":env:"):
            continue
        rank = {"global": 0, "download": 1, "install": 1, ":env:": 2}[section]
        value = raw.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        ranked.append((rank, key, value))
    for _, key, value in sorted(ranked, key=lambda r: r[0]):
        values[key] = value
    settings = PipSettings(
        index_url=values.get("index-url") or None,
        extra_index_urls=values.get("extra-index-url", "").split(),
        find_links=values.get("find-links", "").split(),
        trusted_hosts=values.get("trusted-host", "").split(),
        no_index=values.get("no-index", "").lower() in ("1", "true", "yes", "on"),
        cert=values.get("cert") or None,
        timeout=values.get("timeout") or values.get("default-timeout") or None,
        retries=values.get("retries") or None,
    )
    if settings.cert is None:
        settings.cert = environ.get("REQUESTS_CA_BUNDLE") or environ.get("SSL_CERT_FILE") or None
    return settings


def ca_bundle(settings: PipSettings) -> Path | None:
    """The CA bundle pip uses here: its ``cert`` setting, else the system bundle, else certifi's."""
    if settings.cert and Path(settings.cert).is_file():
        return Path(settings.cert)
    for path in _SYSTEM_CA:
        if Path(path).is_file():
            return Path(path)
    try:
        import certifi

        return Path(certifi.where())
    except ImportError:
        return None


def _local_path(location: str) -> Path | None:
    """The folder or file a find-links entry or index URL names on this machine, or None (a URL)."""
    parsed = urllib.parse.urlparse(location)
    if parsed.scheme == "file":
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "" and location:
        return Path(location)
    return None


class _Handler(http.server.SimpleHTTPRequestHandler):
    """GET/HEAD of files under one mount table ({prefix: folder}); nothing else."""

    mounts: ClassVar[dict[str, Path]] = {}

    def translate_path(self, path: str) -> str:
        parts = urllib.parse.unquote(urllib.parse.urlsplit(path).path).lstrip("/").split("/", 1)
        root = self.mounts.get(parts[0])
        if root is None:
            return "/nonexistent-lmforge-path"
        rest = [p for p in (parts[1] if len(parts) > 1 else "").split("/") if p not in ("", ".", "..")]
        return str(root.joinpath(*rest))

    def log_message(self, format: str, *args: object) -> None:
        return


class LocalPackageServer:
    """Serves local folders read-only on ``127.0.0.1`` (``with`` starts and stops it)."""

    def __init__(self) -> None:
        self.mounts: dict[str, Path] = {}
        self._server: http.server.ThreadingHTTPServer | None = None

    def add(self, folder: Path) -> str:
        """Serve ``folder``; returns its URL path prefix (``/<n>``)."""
        for prefix, existing in self.mounts.items():
            if existing == folder:
                return f"/{prefix}"
        prefix = f"p{len(self.mounts)}"
        self.mounts[prefix] = folder
        return f"/{prefix}"

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the package server is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> LocalPackageServer:
        if self.mounts:
            handler = type("Handler", (_Handler,), {"mounts": dict(self.mounts)})
            self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            self._server.daemon_threads = True
            threading.Thread(target=self._server.serve_forever, name="lmforge-pip-files", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@functools.lru_cache(maxsize=32)
def index_answers(url: str, timeout_s: float = 5.0) -> bool:
    """Whether ``url`` answers an HTTP request within ``timeout_s`` (any status below 500)."""
    context = None
    settings_ca = ca_bundle(read_pip_settings())
    if settings_ca is not None:
        context = ssl.create_default_context(cafile=str(settings_ca))
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return int(response.status) < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


class BuildPipInputs:
    """The ``pipconf``/``pipca`` secrets for one build, with local sources served meanwhile.

    ``with BuildPipInputs(settings, extra_indexes) as inputs:`` then ``inputs.secrets`` and
    ``inputs.network_host``; the temporary files and the server go away on exit.
    """

    def __init__(
        self,
        settings: PipSettings,
        extra_indexes: Iterable[str] = (),
        *,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.extra_indexes = [u for u in extra_indexes if u not in settings.extra_index_urls]
        self.echo = echo or (lambda _m: None)
        self.server = LocalPackageServer()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.secrets: list[Secret] = []
        self.notes: list[str] = []
        self.marker = f"{SECRET_MARKER}-{secrets.token_hex(12)}"
        """Written into both secrets: a string that appears nowhere else (lmforge's own source
        names only the prefix)."""

    @property
    def network_host(self) -> bool:
        return bool(self.server.mounts)

    def _index(self, location: str) -> str:
        """An index URL as the build reaches it (a local index is served from the folder above)."""
        path = _local_path(location)
        if path is None:
            return location
        path = path.resolve()
        prefix = self.server.add(path.parent)
        return f"{{server}}{prefix}/{urllib.parse.quote(path.name)}/"

    def _find_links(self, location: str) -> str:
        path = _local_path(location)
        if path is None:
            return location
        path = path.resolve()
        if path.is_file():
            return f"{{server}}{self.server.add(path.parent)}/{urllib.parse.quote(path.name)}"
        return f"{{server}}{self.server.add(path)}/"

    def pip_conf(self) -> str:
        s = self.settings
        lines = [f"# {self.marker}: pip settings of the building machine, for this build only", "[global]"]
        if s.no_index:
            lines.append("no-index = true")
        if s.index_url:
            lines.append(f"index-url = {self._index(s.index_url)}")
        extra = [self._index(u) for u in s.extra_index_urls]
        for url in self.extra_indexes:
            if index_answers(url):
                extra.append(url)
            else:
                self.notes.append(f"{url} does not answer from here: not used for this build")
        if extra:
            lines.append("extra-index-url = " + " ".join(extra))
        links = [self._find_links(loc) for loc in s.find_links]
        if links:
            lines.append("find-links = " + " ".join(links))
        if s.trusted_hosts:
            lines.append("trusted-host = " + " ".join(s.trusted_hosts))
        lines.append(f"timeout = {s.timeout or 60}")
        if s.retries:
            lines.append(f"retries = {s.retries}")
        return "\n".join(lines) + "\n"

    def __enter__(self) -> BuildPipInputs:
        self._tmp = tempfile.TemporaryDirectory(prefix="lmforge-build-")
        folder = Path(self._tmp.name)
        template = self.pip_conf()
        self.server.__enter__()
        conf = folder / "pip.conf"
        conf.write_text(template.replace("{server}", self.server.url if self.server.mounts else ""))
        conf.chmod(0o600)
        self.secrets = [Secret("pipconf", conf)]
        ca = ca_bundle(self.settings)
        if ca is not None:
            copy = folder / "ca.pem"
            copy.write_bytes(ca.read_bytes().rstrip(b"\n") + f"\n# {self.marker}\n".encode())
            copy.chmod(0o600)
            self.secrets.append(Secret("pipca", copy))
        if self.server.mounts:
            served = ", ".join(str(p) for p in self.server.mounts.values())
            self.notes.append(f"serving local package folders to the build on {self.server.url}: {served}")
        for note in self.notes:
            self.echo(note)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.__exit__()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def describe(settings: PipSettings) -> str:
    """One line for the build log: where pip in the build will look."""
    parts = [f"index {settings.index_url or 'PyPI'}"]
    if settings.extra_index_urls:
        parts.append("extra " + " ".join(shlex.quote(u) for u in settings.extra_index_urls))
    if settings.find_links:
        parts.append("find-links " + " ".join(shlex.quote(u) for u in settings.find_links))
    return ", ".join(parts)
