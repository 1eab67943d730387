"""Which LoRA adapters are resident in LMI-Dist's layers: the frontend's side of per-request adapters.

At most ``max_loras`` adapters are installed in the model at once. A request for an adapter that is
not resident waits until a slot is free or an idle resident adapter can be evicted (least recently
used first; pinned adapters never leave), then the engine core installs it (:meth:`Installer.install`,
a call over the frontend-core wire). Removing an adapter refuses new requests for it at once and
uninstalls it when its last running request is done.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from lmforge.errors import BadRequestError, NotFoundError

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter


class Installer(Protocol):
    """The engine core's adapter calls."""

    async def install(self, adapter: LoraAdapter) -> None: ...

    async def uninstall(self, adapter_id: int) -> None: ...

    async def preload(self, adapter: LoraAdapter) -> None: ...

    async def forget(self, adapter_id: int) -> None: ...


class LoraSlots:
    def __init__(self, installer: Installer, max_loras: int) -> None:
        self.installer = installer
        self.max_loras = max_loras
        self._resident: OrderedDict[int, int] = OrderedDict()  # adapter id -> running requests (LRU order)
        self._removed: set[int] = set()
        self._pinned: set[int] = set()
        self._cond = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self.loads_total = 0
        self.evictions_total = 0

    async def add(self, adapter: LoraAdapter, preload: bool, pin: bool = False) -> None:
        """``preload`` reads the adapter into the core's host memory now; ``pin`` also installs it and
        keeps it resident (it never leaves its slot)."""
        if pin:
            if len(self._pinned) + 1 >= self.max_loras:  # one slot stays free, or other adapters wait forever
                raise BadRequestError(
                    f"cannot pin adapter {adapter.name!r}: {len(self._pinned)} of option.max_loras="
                    f"{self.max_loras} slots are pinned and one must stay free for other adapters",
                    param="pin",
                )
            self._pinned.add(adapter.int_id)
            try:
                await self.acquire(adapter)
            except BaseException:
                self._pinned.discard(adapter.int_id)
                raise
            self.release(adapter)
        elif preload:
            await self.installer.preload(adapter)

    async def remove(self, adapter: LoraAdapter) -> None:
        """No new request may use ``adapter``; its weights go once its running requests are done."""
        self._removed.add(adapter.int_id)
        self._pinned.discard(adapter.int_id)
        await self.installer.forget(adapter.int_id)
        if not self._resident.get(adapter.int_id):
            self._resident.pop(adapter.int_id, None)
            await self.installer.uninstall(adapter.int_id)
            await self._notify()

    async def acquire(self, adapter: LoraAdapter) -> None:
        """Wait until ``adapter`` is resident and count one more request on it."""
        async with self._cond:
            while True:
                if adapter.int_id in self._removed:
                    raise NotFoundError(f"adapter {adapter.name!r} was removed", param="adapters")
                if adapter.int_id in self._resident:
                    self._resident[adapter.int_id] += 1
                    self._resident.move_to_end(adapter.int_id)
                    return
                if len(self._resident) < self.max_loras:
                    break
                victim = self._idle()
                if victim is not None:
                    del self._resident[victim]
                    await self.installer.uninstall(victim)
                    self.evictions_total += 1
                    break
                await self._cond.wait()
            self._resident[adapter.int_id] = 1  # reserved: other acquirers wait on the lock meanwhile
            try:
                await self.installer.install(adapter)
                self.loads_total += 1
            except BaseException:
                self._resident.pop(adapter.int_id, None)
                await asyncio.shield(self.installer.uninstall(adapter.int_id))
                raise

    async def evict_idle(self) -> int:
        """Uninstall every resident adapter with no running request and no pin; returns how many."""
        async with self._cond:
            victims = [i for i, users in self._resident.items() if users == 0 and i not in self._pinned]
            for adapter_id in victims:
                del self._resident[adapter_id]
                await self.installer.uninstall(adapter_id)
            self.evictions_total += len(victims)
            self._cond.notify_all()
        return len(victims)

    async def drop_host_copy(self, adapter: LoraAdapter) -> None:
        """Drop the core's host-memory copy of ``adapter`` (it is read from disk when next needed);
        its installed weights, if resident, stay."""
        await self.installer.forget(adapter.int_id)

    def _idle(self) -> int | None:
        for adapter_id, users in self._resident.items():
            if users == 0 and adapter_id not in self._pinned:
                return adapter_id
        return None

    def release(self, adapter: LoraAdapter) -> None:
        """One request on ``adapter`` is done (synchronous: safe in any ``finally``; the core's uninstall
        of a removed adapter and the wake-up of waiters run as tasks)."""
        users = self._resident.get(adapter.int_id)
        if users is None:
            return
        self._resident[adapter.int_id] = users - 1
        if users - 1 == 0 and adapter.int_id in self._removed:
            del self._resident[adapter.int_id]
            self._spawn(self.installer.uninstall(adapter.int_id))
        self._spawn(self._notify())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    def stats(self) -> dict[str, float]:
        return {
            "lora_resident": float(len(self._resident)),
            "lora_loads_total": float(self.loads_total),
            "lora_evictions_total": float(self.evictions_total),
        }
