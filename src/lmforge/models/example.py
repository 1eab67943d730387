"""The embedded example model: a tiny random-weight Llama with a locally trained tokenizer.

``write_example_model(DIR)`` needs no hub and no network and takes a few seconds: it trains a
byte-level BPE tokenizer on the Python standard library's sources, builds a 0.9 M-parameter Llama
with random weights, and saves both in the Hugging Face layout (safetensors) with a chat template and
a ``serving.properties``, so the real loading code (``AutoModelForCausalLM.from_pretrained``) reads
it. The output is deterministic for a given seed and Python version. Its text is gibberish.

torch, transformers and tokenizers are imported inside the functions, so importing this module is cheap
and works without them.
"""

from __future__ import annotations

import os
import platform
import shutil
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.models.files import FILE_MODE

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "write_example_model"]

VOCAB_SIZE = 2048
CORPUS_FILES = 60
MODEL_MAX_LENGTH = 2048
BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
SPECIAL_TOKENS = [UNK, BOS, EOS, PAD, *ROLE_TOKENS]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MODEL_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": MODEL_MAX_LENGTH,
}
# The default (0.02) gives nearly flat logits, so greedy argmax can flip between a batched and an
# unbatched run on float rounding alone; 0.2 gives peaked logits and stable greedy outputs.
INITIALIZER_RANGE = 0.2

SERVING_PROPERTIES = """\
# lmforge example model: a tiny random-weight Llama (see README.md in this folder).
# Engine name as in LMI; Python = lmforge's Python engines (one process per model copy).
engine=Python
# Continuous-batching backend: lmi-dist starts in seconds on a CPU. vllm serves this model too
# (pip install 'lmforge[vllm]'); auto picks the best installed (vllm before lmi-dist).
option.rolling_batch=lmi-dist
# Weights are saved in float32; serve them as they are.
option.dtype=fp32
# Most sequences decoded together in the running batch.
option.max_rolling_batch_size=32
# Longest prompt + generated tokens of one request, in tokens; sizes the KV cache.
option.max_model_len=1024
"""

README = """\
# lmforge example model

A tiny Llama (hidden size 128, 2 layers, 4 attention heads / 2 KV heads, {params:,} parameters) with
**random weights**. It exists to exercise the real loading, batching and serving code quickly on any
machine, GPU or not: **its output is gibberish**. Do not use it for anything but testing.

How it was made (`lmforge example-model`, seed {seed}, Python {python}), with no hub and no network:

- Tokenizer: byte-level BPE with a vocabulary of {vocab} tokens, trained with `tokenizers` on the first
  {corpus} `*.py` files (sorted by name) of the Python standard library's top-level folder.
  Special tokens: {specials}.
  `<s>` (BOS) is prepended to every encoded text. Chat template: `chat_template.jinja`.
- Model: `LlamaForCausalLM` initialised by `torch.manual_seed({seed})` with `initializer_range={init}`,
  saved as float32 safetensors.
- `serving.properties`: the lmforge / LMI settings to serve it.

The same seed and Python version give the same tokenizer and weights.

Serve it with `lmforge serve <this folder>`.
"""

Progress = Callable[[str], None]


def _corpus() -> Iterator[str]:
    """The training text: the first ``CORPUS_FILES`` stdlib modules, in sorted order (deterministic)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(stdlib.glob("*.py"), key=lambda p: p.name)[:CORPUS_FILES]
    if not paths:
        raise FileNotFoundError(f"no *.py files in the Python standard library folder {stdlib}")
    for path in paths:
        yield path.read_text(encoding="utf-8", errors="replace")


def _train_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=MODEL_MAX_LENGTH,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _save_model(tokenizer: PreTrainedTokenizerFast, seed: int, out: Path) -> int:
    """Build the random-weight Llama for ``tokenizer``, save it to ``out`` and return its parameter count."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    ids: dict[str, int] = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        **MODEL_SHAPE,
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
        **ids,
    )
    # Seed the global generator for the initialisation only, and give the caller back its state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(**ids)
    params = sum(p.numel() for p in model.parameters())

    verbosity = hf_logging.get_verbosity()
    progress_bar = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)  # safetensors is the only format transformers 5 writes
    finally:
        hf_logging.set_verbosity(verbosity)
        if progress_bar:
            hf_logging.enable_progress_bar()
    return int(params)


def check_destination(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{out} is not empty; choose an empty or new folder, or pass overwrite=True (--overwrite) "
            "to write the model's files into it"
        )


def write_example_model(
    path: str | Path,
    *,
    seed: int = 0,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write the example model to ``path`` (created with its parents) and return it.

    Refuses a non-empty folder with :class:`FileExistsError` unless ``overwrite``; with it, the model's
    files replace those of the same name and any other file is left alone. The files are built in a
    staging folder first, so a failure leaves no half-written model behind. ``progress``, when given,
    receives a short line before each step. Every file written has mode 0644.
    """
    out = Path(path)
    check_destination(out, overwrite)
    say: Progress = progress or (lambda _line: None)
    out.mkdir(parents=True, exist_ok=True)

    staging = Path(tempfile.mkdtemp(prefix=".example-model-", dir=out))
    try:
        say(f"training tokenizer (byte-level BPE, {VOCAB_SIZE} tokens, Python standard library)...")
        tokenizer = _train_tokenizer()
        tokenizer.save_pretrained(staging)

        say(f"building model (random-weight Llama, seed {seed})...")
        params = _save_model(tokenizer, seed, staging)

        (staging / "serving.properties").write_text(SERVING_PROPERTIES, encoding="utf-8")
        readme = README.format(
            params=params,
            seed=seed,
            python=platform.python_version(),
            vocab=len(tokenizer),
            corpus=CORPUS_FILES,
            specials=", ".join(f"`{t}`" for t in SPECIAL_TOKENS),
            init=INITIALIZER_RANGE,
        )
        (staging / "README.md").write_text(readme, encoding="utf-8")

        for file in sorted(f for f in staging.iterdir() if f.is_file()):
            # safetensors writes 0600 whatever the umask; a server running as another user must read it.
            os.chmod(file, FILE_MODE)
            os.replace(file, out / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
