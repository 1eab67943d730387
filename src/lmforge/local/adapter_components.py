"""Adapter inference components (``BaseInferenceComponentName``) get no container of their own: the
adapter is downloaded from ``Container.ArtifactUrl`` (a ``.tar.gz`` or an S3 prefix) into
``<state>/adapters/<account>/<region>/<base component>/``, a folder the base component's container
may read (its ``LMFORGE_ADAPTER_ROOTS``; mounted read-only at the same path into an image), and
registered there through the adapters API (:class:`lmforge.client.adapters.AdaptersClient`, name =
the adapter component's name). Invocations of the adapter component go to the base's container with
``X-Amzn-SageMaker-Adapter-Identifier``. An update re-registers it, a delete deregisters it and
removes its files, and a base container that is restarted or replaced gets its adapters registered
again."""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from lmforge.adapters.sources import PLATFORM_ADAPTER_ROOTS_ENV
from lmforge.client.adapters import AdaptersApiError, AdaptersClient
from lmforge.local.containers import Container
from lmforge.local.model_data import ModelDataError, fetch_model_data, s3_client
from lmforge.local.placements import AdapterPlacement, Key, Placements, ProvisionError

log = logging.getLogger("lmforge.local")

DEFAULT_HEALTH_CHECK_TIMEOUT_S = 240  # SageMaker's default: pass /ping within 4 minutes
DEFAULT_DOWNLOAD_TIMEOUT_S = 3600
FAILURE_REASON_MAX = 1024


class AdapterComponents(Placements):
    state_dir: Path
    s3_endpoint_url: str
    _adapter_locks: dict[Key, threading.Lock]

    def _adapter_root(self, account: str, region: str, base: str) -> Path:
        return self.state_dir / "adapters" / account / region / base

    def _adapter_lock(self, key: tuple[str, str, str]) -> threading.Lock:
        with self._lock:
            return self._adapter_locks.setdefault(key, threading.Lock())

    def _provision_adapter(self, backend: Any, component: Any, generation: int, updating: bool) -> None:
        """Download the adapter and register it with the base component's container."""
        from lmforge.local.inference_components import components

        key = (backend.account_id, backend.region_name, component.name)
        spec = component.specification
        base = str(spec["BaseInferenceComponentName"])
        startup = spec.get("StartupParameters") or {}
        with self._adapter_lock(key):
            folder: Path | None = None
            try:
                copies = self._wait_for_base(backend, base, component)
                download_s = float(
                    startup.get("ModelDataDownloadTimeoutInSeconds") or DEFAULT_DOWNLOAD_TIMEOUT_S
                )
                folder, src = self._fetch_adapter(
                    (spec.get("Container") or {}).get("ArtifactUrl"),
                    self._adapter_root(key[0], key[1], base),
                    component.name,
                    download_s,
                )
                with self._lock:
                    previous = self._adapters.get(key)
                for container in copies:  # every copy of the base serves the adapter
                    self._register(container, base, component.name, src, update=previous is not None)
            except Exception as exc:
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
                reason = str(exc) if isinstance(exc, ProvisionError) else f"{type(exc).__name__}: {exc}"
                log.warning("adapter inference component %s failed: %s", component.name, reason)
                if component.generation == generation:
                    component.failure_reason = reason[:FAILURE_REASON_MAX]
                    component.status = "InService" if updating else "Failed"
                return
            placement = AdapterPlacement(component.endpoint_name, component.variant_name, base, folder, src)
            with self._lock:
                registered: Any = components(backend).get(component.name)
                current = (
                    not self._stopping.is_set()
                    and registered is component
                    and generation == component.generation
                )
                old = self._adapters.get(key) if current else None
                if current:
                    self._adapters[key] = placement
            if not current:
                if components(backend).get(component.name) is not component:  # deleted meanwhile
                    for container in copies:
                        self._deregister(container, component.name)
                shutil.rmtree(folder, ignore_errors=True)
                return
            component.failure_reason = None
            component.current_copies = component.copy_count
            component.status = "InService"
            log.info("adapter inference component %s is InService on %s", component.name, base)
            if old is not None and old.folder != folder:
                shutil.rmtree(old.folder, ignore_errors=True)

    def _wait_for_base(self, backend: Any, base: str, adapter: Any) -> list[Container]:
        """The base component's live copies once it serves (none while it has zero copies: each copy
        that starts later registers the adapter); ProvisionError when it never will."""
        from lmforge.local.inference_components import components

        key = (backend.account_id, backend.region_name, base)
        name = str(adapter.name)
        deadline = time.monotonic() + DEFAULT_HEALTH_CHECK_TIMEOUT_S
        while not self._stopping.is_set():
            if components(backend).get(name) is not adapter:
                raise ProvisionError(f"{name} was deleted")
            component = components(backend).get(base)
            if component is None:
                raise ProvisionError(f"The base inference component {base} of {name} no longer exists.")
            with self._lock:
                placed = self._components.get(key)
            live = [c for c in placed.containers if c.alive] if placed is not None else []
            if placed is not None and (live or not placed.copies):
                return live
            if component.status == "Failed":
                why = component.failure_reason or "no reason given"
                raise ProvisionError(f"The base inference component {base} is Failed ({why}).")
            if time.monotonic() > deadline:
                raise ProvisionError(f"The base inference component {base} did not come into service in time")
            time.sleep(0.3)
        raise ProvisionError("the local SageMaker is stopping")

    def _fetch_adapter(self, url: Any, root: Path, name: str, timeout_s: float) -> tuple[Path, Path]:
        """Download ``url`` (a ``.tar.gz`` or an S3 prefix) into a fresh folder under ``root``; returns
        (that folder, the adapter folder: itself, or the one folder it holds when that has the adapter)."""
        if not isinstance(url, str) or not url.startswith("s3://"):
            raise ProvisionError(
                "Specification.Container.ArtifactUrl must give the adapter's S3 location (s3://...)"
            )
        folder = root / f"{name}-{uuid.uuid4().hex[:8]}"
        if url.endswith((".tar.gz", ".tgz")):
            spec: dict[str, Any] = {"ModelDataUrl": url}
        else:
            source = {"S3Uri": url.rstrip("/") + "/", "S3DataType": "S3Prefix", "CompressionType": "None"}
            spec = {"ModelDataSource": {"S3DataSource": source}}
        try:
            fetch_model_data(spec, folder, s3=s3_client(self.s3_endpoint_url), timeout_s=timeout_s)
        except ModelDataError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise ProvisionError(f"Could not download the adapter from {url}: {exc}") from None
        src = folder
        if not (folder / "adapter_config.json").exists():
            entries = [p for p in folder.iterdir() if p.name != "lmforge-manifest.json"]
            if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
                src = entries[0]  # a tarball of the adapter's folder rather than of its files
        return folder, src

    def _register(self, container: Container, base: str, name: str, src: Path, *, update: bool) -> None:
        """Register (or update) adapter ``name`` with the base's container; ProvisionError on refusal."""
        client = AdaptersClient(f"http://127.0.0.1:{container.port}")
        headers = {"X-Amzn-SageMaker-Adapter-Alias": name}
        try:
            if update:
                status, answer = client.request("PUT", f"/adapters/{name}", {"src": str(src)}, headers)
                if status != 404:
                    _check_answer(status, answer, base, name)
                    return
            status, answer = client.request("POST", "/adapters", {"name": name, "src": str(src)}, headers)
        except AdaptersApiError as exc:
            raise ProvisionError(
                f"The container of base inference component {base} is unreachable: {exc}"
            ) from None
        _check_answer(status, answer, base, name)

    def _deregister(self, container: Container, name: str) -> None:
        try:
            AdaptersClient(f"http://127.0.0.1:{container.port}").remove(name)
        except AdaptersApiError as exc:  # a container that is gone has no registration left
            if exc.status not in (None, 404):
                log.warning("deregistering adapter %s answered %s: %s", name, exc.status, exc.message)

    def _remove_adapter(self, key: tuple[str, str, str], placement: AdapterPlacement) -> None:
        """DeleteInferenceComponent of an adapter component: deregister it, then drop its files."""
        with self._adapter_lock(key):
            with self._lock:
                base = self._components.get((key[0], key[1], placement.base))
            for container in base.containers if base is not None else []:
                self._deregister(container, key[2])
            shutil.rmtree(placement.folder, ignore_errors=True)

    def _register_all(self, base_key: tuple[str, str, str], container: Container) -> None:
        """Register every adapter component of a base with ``container`` (a new or restarted one)."""
        with self._lock:
            adapters = [
                (k, a)
                for k, a in self._adapters.items()
                if (k[0], k[1]) == base_key[:2] and a.base == base_key[2]
            ]
        for key, placement in adapters:
            try:
                self._register(container, placement.base, key[2], placement.src, update=False)
            except (ProvisionError, OSError) as exc:
                log.warning("adapter %s could not be registered again: %s", key[2], exc)

    def _reregister_after_restart(self, container: Container) -> None:
        with self._lock:
            keys = [k for k, p in self._components.items() if any(c is container for c in p.containers)]
        if not keys or not container.wait_healthy(DEFAULT_HEALTH_CHECK_TIMEOUT_S):
            return
        self._register_all(keys[0], container)


def allow_adapter_root(env: dict[str, str], root: Path) -> None:
    """Let the container register adapters from ``root`` (the platform's download folder): added to
    ``LMFORGE_ADAPTER_ROOTS``, which adds to whatever ``option.adapter_roots`` the model sets."""
    roots = [r for r in env.get(PLATFORM_ADAPTER_ROOTS_ENV, "").split(",") if r.strip()]
    env[PLATFORM_ADAPTER_ROOTS_ENV] = ",".join([*roots, str(root)])


def _check_answer(status: int, answer: dict[str, Any], base: str, name: str) -> None:
    if status != 200:
        raise ProvisionError(
            f"The container of base inference component {base} refused adapter {name} "
            f"(status {status}): {answer.get('message') or answer}"
        )
