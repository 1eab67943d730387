"""LoRA adapters: what one is (:mod:`.spec`), where it may come from (:mod:`.sources`), how it is
checked (:mod:`.validate`) and the server's registry (:mod:`.registry`). Importing this package
imports no engine and no torch."""

from lmforge.adapters.spec import LoraAdapter, LoraShape

__all__ = ["LoraAdapter", "LoraShape"]
