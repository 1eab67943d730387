"""The watchdog: an instance that dies while it is registered is started again (with backoff), as
SageMaker replaces a failed instance; until it answers, invocations get a ``ModelError``."""

from __future__ import annotations

import logging
import time
from functools import partial

from lmforge.local.containers import Container
from lmforge.local.placements import Placements

log = logging.getLogger("lmforge.local")

WATCH_EVERY_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0


class Supervision(Placements):
    _next_restart: dict[int, float]

    def _reregister_after_restart(self, container: Container) -> None:
        """What a restarted container needs again; :class:`AdapterComponents` registers its adapters
        (it comes before this class in the provisioner's bases)."""

    def _watch(self) -> None:
        """Restart containers that die while registered (with backoff), as SageMaker replaces instances."""
        while not self._stopping.wait(WATCH_EVERY_S):
            with self._lock:
                registered = [c for d in self._deployments.values() for c in d.instances()]
                registered += [c for p in self._components.values() for c in p.containers]
            now = time.monotonic()
            for container in registered:
                if container.alive or container.stopping:
                    continue
                key = id(container)
                if now < self._next_restart.get(key, 0.0):
                    continue
                container.restarts += 1
                backoff = min(MAX_RESTART_BACKOFF_S, 2.0 ** (container.restarts - 1))
                self._next_restart[key] = now + backoff
                log.warning(
                    "container %s exited with code %s; restarting it (restart %d)",
                    container.folder,
                    container.returncode,
                    container.restarts,
                )
                container.start()
                self._run(partial(self._reregister_after_restart, container), f"adapters-{container.label}")
