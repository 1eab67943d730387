"""Engine-side bookkeeping of registered adapters for backends that take a per-request handle
(vLLM's and TensorRT-LLM's ``LoRARequest``): the handle of each adapter, the requests running with
it, and a removal that waits for those requests (the engine may still read the adapter's files)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from lmforge.errors import NotFoundError

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter


class LoraHandles:
    def __init__(self) -> None:
        self._handles: dict[int, Any] = {}
        self._users: dict[int, int] = {}
        self._idle: dict[int, asyncio.Event] = {}

    def add(self, adapter: LoraAdapter, handle: Any) -> None:
        self._handles[adapter.int_id] = handle

    def get(self, adapter: LoraAdapter | None) -> Any:
        """The handle for a request's adapter (None for the base model)."""
        if adapter is None:
            return None
        handle = self._handles.get(adapter.int_id)
        if handle is None:
            raise NotFoundError(
                f"adapter {adapter.name!r} is not registered (or was removed)", param="adapters"
            )
        return handle

    def begin(self, adapter_id: int) -> None:
        """One more request runs with the adapter (until :meth:`done`)."""
        self._users[adapter_id] = self._users.get(adapter_id, 0) + 1

    def done(self, adapter_id: int) -> None:
        users = self._users.get(adapter_id, 0) - 1
        if users > 0:
            self._users[adapter_id] = users
            return
        self._users.pop(adapter_id, None)
        idle = self._idle.get(adapter_id)
        if idle is not None:
            idle.set()

    async def retire(self, adapter: LoraAdapter) -> bool:
        """New requests cannot use ``adapter``; returns once those running with it are done.
        False when it was not registered."""
        if self._handles.pop(adapter.int_id, None) is None:
            return False
        if self._users.get(adapter.int_id):
            await self._idle.setdefault(adapter.int_id, asyncio.Event()).wait()
        self._idle.pop(adapter.int_id, None)
        return True
