"""LoRA test material: PEFT adapters for the tiny model, and PEFT itself as the reference output.

Adapters are made with ``peft`` (``init_lora_weights=False`` and a re-drawn, large ``lora_B`` so each
adapter visibly changes the greedy tokens) and saved with ``save_pretrained`` (PEFT layout,
safetensors). :class:`PeftReference` runs PEFT's own forward with one adapter active: the oracle that
every backend's per-request adapter output must match token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_adapter(
    model_dir: Path,
    out: Path,
    *,
    seed: int,
    rank: int = 8,
    alpha: int = 16,
    targets: Sequence[str] = ALL_TARGETS,
    std: float = 0.5,
) -> Path:
    """Write a random LoRA adapter for ``model_dir`` into ``out`` (created) and return ``out``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        init_lora_weights=False,
    )
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, std)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


class PeftReference:
    """PEFT's greedy output for one adapter at a time (or the base model), fp32, batch 1."""

    def __init__(self, model_dir: Path, adapters: dict[str, Path]) -> None:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(1)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32").eval()
        names = list(adapters)
        self.model: Any = PeftModel.from_pretrained(base, str(adapters[names[0]]), adapter_name=names[0])
        for name in names[1:]:
            self.model.load_adapter(str(adapters[name]), adapter_name=name)
        self.model.eval()

    def greedy(self, prompt: str, max_new_tokens: int, adapter: str | None) -> list[int]:
        """Token ids PEFT generates for ``prompt`` with ``adapter`` (None: the base model), EOS ignored."""
        import torch

        ids = self.tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            if adapter is None:
                with self.model.disable_adapter():
                    out = self._generate(ids, max_new_tokens)
            else:
                self.model.set_adapter(adapter)
                out = self._generate(ids, max_new_tokens)
        return [int(t) for t in out[0, ids.shape[1] :].tolist()]

    def prompt_logprobs(self, prompt: str, adapter: str | None) -> list[float]:
        """The log-prob of each of ``prompt``'s tokens after the first, given those before it, with
        ``adapter`` (None: the base model): one forward pass."""
        import torch

        ids = self.tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            if adapter is None:
                with self.model.disable_adapter():
                    logits = self.model(input_ids=ids).logits
            else:
                self.model.set_adapter(adapter)
                logits = self.model(input_ids=ids).logits
        rows = logits[0, :-1].float().log_softmax(-1)
        return [float(v) for v in rows.gather(1, ids[0, 1:, None]).squeeze(1).tolist()]

    def _generate(self, ids: Any, max_new_tokens: int) -> Any:
        return self.model.generate(
            input_ids=ids,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=self.tokenizer.pad_token_id,
        )
