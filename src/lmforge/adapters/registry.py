"""The server's adapter registry: names -> checked adapters, kept in step with the engine.

One registry per server (the default handler owns it). Registration resolves the source
(:mod:`.sources`), checks the folder against the base model (:mod:`.validate`) off the event loop,
then hands the adapter to the engine; removal takes it away from new requests at once while requests
already running with it finish. Mutations are serialised; lookups are plain dict reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.adapters.sources import SourcePolicy
from lmforge.adapters.spec import NAME_PATTERN, LoraAdapter
from lmforge.adapters.validate import AdapterError, check_files, check_weights, read_config, scaling_of
from lmforge.errors import BadRequestError, ConflictError, NotFoundError

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import LoraEngine

log = logging.getLogger("lmforge.adapters")

LORA_DISABLED = "LoRA adapters are not enabled; set option.enable_lora=true to serve them"


def check_name(name: Any, param: str = "name") -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or name in (".", ".."):
        raise BadRequestError(
            f"adapter name {name!r} is invalid: 1-128 characters, letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            param=param,
        )
    return name


class AdapterRegistry:
    def __init__(self, config: ServingConfig, engine: LoraEngine, policy: SourcePolicy | None = None) -> None:
        self.config = config
        self.engine = engine
        self.policy = policy or SourcePolicy.from_config(config)
        self._adapters: dict[str, LoraAdapter] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._adapters)

    def get(self, name: str) -> LoraAdapter:
        adapter = self._adapters.get(name)
        if adapter is None:
            known = ", ".join(sorted(self._adapters)[:20]) or "none registered"
            raise NotFoundError(f"adapter {name!r} is not registered (adapters: {known})", param="adapters")
        return adapter

    def all(self) -> list[LoraAdapter]:
        """Every registered adapter, by name."""
        return [self._adapters[n] for n in sorted(self._adapters)]

    def find(self, name: str) -> LoraAdapter | None:
        return self._adapters.get(name)

    def find_alias(self, alias: str) -> LoraAdapter | None:
        """The adapter registered under SageMaker alias ``alias`` (the first by name, if several)."""
        return next((a for a in self.all() if a.options.get("alias") == alias), None)

    def page(self, limit: int, token: int) -> tuple[list[LoraAdapter], int | None]:
        names = sorted(self._adapters)
        chunk = [self._adapters[n] for n in names[token : token + limit]]
        nxt = token + limit if token + limit < len(names) else None
        return chunk, nxt

    # ------------------------------------------------------------------ changes

    def _check(self, name: str, src: str, options: Mapping[str, Any]) -> LoraAdapter:
        """Resolve and validate (blocking: file reads, maybe an S3 download)."""
        folder, root = self.policy.resolve(src)
        try:
            data = self._check_unweighted(folder, root)
            layers, size = check_weights(folder, data, self.engine.lora_layers())
        except BaseException:
            if self.policy.owns(folder):
                shutil.rmtree(folder, ignore_errors=True)
            raise
        targets = data["target_modules"]
        return LoraAdapter(
            name=name,
            path=folder,
            src=src,
            int_id=next(self._ids),
            rank=int(data["r"]),
            alpha=float(data.get("lora_alpha", data["r"])),
            scaling=scaling_of(data),
            target_modules=tuple(sorted({layer.module.rsplit(".", 1)[-1] for layer in layers}))
            if not isinstance(targets, list) or len(targets) == 1 else tuple(sorted(targets)),
            layers=tuple(layers),
            base_model=data.get("base_model_name_or_path"),
            size_bytes=size,
            options=dict(options),
        )  # fmt: skip

    async def register(
        self, name: str, src: str, options: Mapping[str, Any] | None = None, *, replace: bool = False
    ) -> LoraAdapter:
        if not self.config.enable_lora:
            raise BadRequestError(LORA_DISABLED, param="option.enable_lora")
        check_name(name)
        async with self._lock:
            old = self._adapters.get(name)
            if old is not None and not replace:
                raise ConflictError(
                    f"adapter {name!r} is already registered (from {old.src}); remove it first or update it",
                    param="name",
                )
            adapter = await asyncio.to_thread(self._check, name, src, options or {})
            try:
                await self.engine.add_adapter(adapter)
            except BaseException:
                self._discard_files(adapter)
                raise
            self._adapters[name] = adapter
            if old is not None:
                await self._drop(old)
        log.info(
            "adapter %s registered from %s (rank %d, %d layers)", name, src, adapter.rank, len(adapter.layers)
        )
        return adapter

    async def update(self, name: str, src: str | None, options: Mapping[str, Any]) -> LoraAdapter:
        current = self.get(name)
        merged = {**current.options, **options}
        return await self.register(name, src or current.src, merged, replace=True)

    async def remove(self, name: str) -> LoraAdapter:
        async with self._lock:
            adapter = self.get(name)
            del self._adapters[name]
            await self._drop(adapter)
        log.info("adapter %s removed", name)
        return adapter

    async def _drop(self, adapter: LoraAdapter) -> None:
        try:
            await self.engine.remove_adapter(adapter)
        finally:
            self._discard_files(adapter)

    def _discard_files(self, adapter: LoraAdapter) -> None:
        if self.policy.owns(adapter.path):
            shutil.rmtree(adapter.path, ignore_errors=True)

    def _check_unweighted(self, folder: Path, root: Path) -> dict[str, Any]:
        """The checks that need no model (files, PEFT config, rank); the adapter's config."""
        check_files(folder, root)
        return read_config(folder, self.config.max_lora_rank)

    def _folder_adapters(self, folder: Path | None) -> list[Path]:
        """The sub-folders of ``folder``, else of the model's ``adapters/`` folders (name = folder name)."""
        from lmforge.adapters.sources import adapter_folders

        subs: list[Path] = []
        for parent in [folder] if folder is not None else adapter_folders(self.config):
            if parent.is_dir():
                subs += sorted(p for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))
        return subs

    @staticmethod
    @contextlib.contextmanager
    def _naming(sub: Path) -> Iterator[None]:
        """An AdapterError about folder ``sub``, prefixed ``adapters/<name>: ``."""
        try:
            yield
        except AdapterError as exc:
            raise AdapterError(f"adapters/{sub.name}: {exc.message}", param="adapters") from None

    def check_folder(self, folder: Path | None = None) -> None:
        """What can be checked of the folder's adapters without the model (their files, PEFT config and
        rank), so that a bad adapter stops the server before the model loads rather than after; the
        weights are checked against the model's layers when :meth:`load_folder` registers them."""
        for sub in self._folder_adapters(folder):
            with self._naming(sub):
                check_name(sub.name)
                self._check_unweighted(*self.policy.resolve(str(sub.resolve())))

    async def load_folder(self, folder: Path | None = None) -> list[str]:
        """Register every sub-folder of the model's ``adapters/`` folders (name = folder name)."""
        names = []
        for sub in self._folder_adapters(folder):
            with self._naming(sub):
                await self.register(sub.name, str(sub.resolve()), {"preload": True})
            names.append(sub.name)
        return names
