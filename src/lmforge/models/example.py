"""The embedded example model: a tiny random-weight Llama with a locally trained tokenizer.

``write_example_model(DIR)`` needs no hub and no network and takes a few seconds: it trains a
byte-level BPE tokenizer on the Python standard library's sources, builds a 0.9 M-parameter Llama
with random weights, and saves both in the Hugging Face layout (safetensors) with a chat template and
a ``serving.properties``, so the real loading code (``AutoModelForCausalLM.from_pretrained``) reads
it. The output is deterministic for a given seed and Python version. Its text is gibberish.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 2048
CORPUS_FILES = 60
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SERVING_PROPERTIES = """\
# lmforge example model: a tiny random-weight Llama (see README.md in this folder).
# LMI's engine name; Python = one process per model copy.
engine=Python
# auto = the best backend installed for this machine (lmi-dist on a CPU).
option.rolling_batch=auto
option.dtype=fp32
# Sequences decoded together in the running batch.
option.max_rolling_batch_size=32
# Longest prompt + output, in tokens; sizes the KV cache.
option.max_model_len=1024
"""
README = """\
# lmforge example model

A 0.9 M-parameter Llama with **random weights** and a byte-level BPE tokenizer trained on the Python
standard library. It exists to exercise the real loading, batching and serving code quickly on any
machine: its output is gibberish. Made by `lmforge example-model` (seed {seed}).

Serve it with `lmforge serve {name}`.
"""


def _corpus() -> Iterator[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py"))[:CORPUS_FILES]:
        yield path.read_text(encoding="utf-8", errors="replace")


def _tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_example_model(path: str | Path, *, seed: int = 0, overwrite: bool = False) -> Path:
    """Write the example model to ``path`` and return it. Refuses a non-empty folder unless ``overwrite``."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{out} is not empty; choose an empty folder or pass overwrite=True (--overwrite)"
        )
    out.mkdir(parents=True, exist_ok=True)

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    tokenizer = _tokenizer()
    tokenizer.save_pretrained(out)  # type: ignore[attr-defined]
    ids = {name: getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.2,  # peaked logits: no greedy near-ties between batched and single runs
        tie_word_embeddings=False,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    )
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    (out / "serving.properties").write_text(SERVING_PROPERTIES)
    (out / "README.md").write_text(README.format(seed=seed, name=out.name))
    for file in out.iterdir():
        if file.is_file():
            os.chmod(file, 0o644)  # safetensors writes 0600; a non-root server must read it
    return out
