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

Modules: :mod:`.process` (:class:`LocalRegistry`), :mod:`.api` (the HTTP API, media types, errors),
:mod:`.storage` (the filesystem storage), :mod:`.binary` (finding the binary).
"""

from lmforge.local.registry.api import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    INDEX_TYPES,
    MANIFEST_TYPES,
    OCI_INDEX,
    OCI_MANIFEST,
    ManifestInfo,
    RegistryError,
)
from lmforge.local.registry.binary import (
    BINARY_ENV,
    BINARY_NAMES,
    find_registry_binary,
    missing_binary_message,
)
from lmforge.local.registry.process import START_TIMEOUT_S, STOP_TIMEOUT_S, LocalRegistry

__all__ = [
    "BINARY_ENV",
    "BINARY_NAMES",
    "DOCKER_LIST",
    "DOCKER_MANIFEST",
    "INDEX_TYPES",
    "MANIFEST_TYPES",
    "OCI_INDEX",
    "OCI_MANIFEST",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "LocalRegistry",
    "ManifestInfo",
    "RegistryError",
    "find_registry_binary",
    "missing_binary_message",
]
