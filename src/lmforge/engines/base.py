"""What every lmforge engine shares: its configuration, the ``option.*`` keys it may take, the
tokenizer, the served model name and the request counters behind ``/metrics``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmforge.config import ServingConfig


class EngineBase:
    name: str

    def __init__(self, config: ServingConfig, extra_options: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.extra_options = dict(extra_options or {})
        self._tokenizer: Any = None
        self._counters: dict[str, float] = {"requests_total": 0.0, "aborted_total": 0.0, "tokens_total": 0.0}
        self.load_seconds = 0.0

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def model_name(self) -> str:
        """``option.model_id`` (a folder's name when it is a local path), else the model folder's name."""
        model_id = self.config.model_id
        if model_id:
            return Path(model_id).name if model_id.startswith(("/", ".", "~")) else model_id
        return self.config.model_dir.name if self.config.model_dir else "model"
