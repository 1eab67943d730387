"""The start-time check of a quantized folder against its manifest (``lmforge-compiled/quantize/``).

``lmforge compile --quantize`` records in the manifest what it wrote: the method, every weight file
with its size and sha256, and the versions of the libraries that read the checkpoint (compressed-tensors,
transformers, safetensors). Every start of LMI-Dist or vLLM on the folder compares that with what is
there now and logs one line, as the vLLM graph cache does (:mod:`lmforge.engines.vllm.compile_cache`):

* ``quantized checkpoint: hit (gptq, ...)``: the weights are the ones compiled, read by the same
  libraries;
* ``quantized checkpoint: miss (<why>, ...)``: a weight file changed, went missing or was added, a
  library's version differs, the manifest disagrees with config.json's ``quantization_config`` (the
  start goes on: the checkpoint's ``quantization_config`` decides how it is read), or the manifest is
  unreadable;
* ``quantized checkpoint: none (<why>)``: nothing to check (an unquantized folder, a quantized one made
  elsewhere without a manifest, quantization at load, or ``option.compile_cache=off``).

An ``option.quantize`` that names another method than the manifest's is refused at every start, naming
both. ``option.compile_cache=required`` (the setting that already makes the vLLM graph cache strict) also
refuses a miss, a quantized checkpoint without a manifest, and quantization at load: with it, a start
serves only weights that ``lmforge compile`` quantized and that are still as it wrote them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.quantize import MANIFEST, QuantizeError, checkpoint_scheme, quantization_config

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

log = logging.getLogger("lmforge.quantize")

#: the libraries whose versions decide how a checkpoint is read; a difference is a miss
READERS = ("compressed-tensors", "transformers", "safetensors")
#: what counts as a weight file in a model folder
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class QuantizeStartError(QuantizeError):
    """A start refused by the manifest check (the message names the option and the folder)."""

    kind = "model_error"


@dataclass(frozen=True)
class QuantDecision:
    status: str
    """``hit``, ``miss`` or ``none``"""
    reasons: tuple[str, ...] = ()
    method: str | None = None
    """the manifest's method (None without a manifest)"""
    quantized: bool = False
    """whether config.json has a ``quantization_config``"""

    def line(self) -> str:
        """The one start-log line."""
        if self.status == "hit":
            return f"quantized checkpoint: hit ({self.method}, weights and readers as compiled)"
        detail = ", ".join(self.reasons)
        return f"quantized checkpoint: {self.status}" + (f" ({detail})" if detail else "")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def weight_files(model_dir: Path) -> list[dict[str, Any]]:
    """The folder's weight files (top level), each ``{"path", "size", "sha256"}``, in name order."""
    return [
        {"path": p.name, "size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(model_dir.iterdir())
        if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
    ]


def library_versions(names: tuple[str, ...] = ("lmforge", "torch", *READERS)) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def _file_reasons(model_dir: Path, recorded: Any) -> list[str]:
    if not isinstance(recorded, list) or not recorded:
        return ["the manifest lists no quantized weight files (written by an older lmforge compile)"]
    reasons = []
    listed = {str(e.get("path")): e for e in recorded if isinstance(e, dict)}
    present = {p.name for p in model_dir.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)}
    for name in sorted(present - set(listed)):
        reasons.append(f"{name} is not in the manifest (added after lmforge compile)")
    for name, entry in sorted(listed.items()):
        path = model_dir / name
        if name not in present:
            reasons.append(f"{name} is missing")
            continue
        size = path.stat().st_size
        if size != entry.get("size"):
            reasons.append(f"{name} has {size:,} bytes, the manifest says {entry.get('size'):,}")
        elif sha256_file(path) != entry.get("sha256"):
            reasons.append(f"{name}: weights digest mismatch (its sha256 is not the manifest's)")
    return reasons


def decide(model_dir: Path, asked: str | None) -> QuantDecision:
    """What the folder's manifest says of this start (see the module docstring). Raises
    :class:`QuantizeStartError` when ``asked`` (``option.quantize``) names another method than the
    manifest's."""
    qc = quantization_config(model_dir)
    path = model_dir / MANIFEST
    if not path.exists():
        if qc is not None:
            why = f"config.json has a quantization_config but there is no {MANIFEST}: made elsewhere"
        elif asked:
            why = f"option.quantize={asked} on an unquantized folder: quantized at load"
        else:
            why = "an unquantized folder"
        return QuantDecision("none", (why,), quantized=qc is not None)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        return QuantDecision("miss", (f"{MANIFEST} is unreadable: {exc}",), quantized=qc is not None)
    made = str(manifest.get("method") or "?")
    if asked and asked.strip().lower() != made:
        raise QuantizeStartError(
            f"option.quantize={asked} but {model_dir} holds a {made} checkpoint (its {MANIFEST} says "
            f"method={made}); remove option.quantize, set it to {made}, or serve the unquantized folder"
        )
    reasons: list[str] = []
    if qc is None:
        reasons.append(f"the manifest says {made} but config.json has no quantization_config")
    else:
        try:
            have = checkpoint_scheme(qc)
        except QuantizeError as exc:
            have = f"unservable ({exc.message})"
        if have != made:
            reasons.append(f"config.json's quantization_config is {have}, the manifest says {made}")
    reasons += _file_reasons(model_dir, manifest.get("files"))
    recorded = manifest.get("libraries")
    libraries: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    now = library_versions(READERS)
    for name in READERS:
        was = libraries.get(name)
        if was != now[name]:
            reasons.append(f"{name} {was or 'unrecorded'} at compile, {now[name]} now")
    status = "miss" if reasons else "hit"
    return QuantDecision(status, tuple(reasons), method=made, quantized=qc is not None)


def check_at_start(config: ServingConfig, model_dir: Path | None, engine: str) -> QuantDecision:
    """Decide, log the ``quantized checkpoint:`` line, and refuse what ``option.compile_cache=required``
    or a disagreeing ``option.quantize`` refuses (:class:`QuantizeStartError`)."""
    asked = config.quantize
    if model_dir is None or not model_dir.is_dir():
        return QuantDecision("none", ("the model is not a local folder",))
    if config.compile_cache == "off":
        decision = QuantDecision("none", ("option.compile_cache=off: the manifest is not checked",))
        log.info("%s: %s", engine, decision.line())
        return decision
    decision = decide(model_dir, asked)
    log.log(logging.WARNING if decision.status == "miss" else logging.INFO, "%s: %s", engine, decision.line())
    if config.compile_cache != "required" or decision.status == "hit":
        return decision
    if decision.status == "miss" or decision.quantized or asked:
        raise QuantizeStartError(
            f"option.compile_cache=required refuses to start {engine} on {model_dir}: "
            f"{decision.line()}; run `lmforge compile SOURCE --quantize METHOD -o {model_dir}` with the "
            "libraries this start has, or set option.compile_cache=auto"
        )
    return decision
