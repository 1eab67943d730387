"""W8A8 int8: the weights rounded to nearest, and the checkpoint written in compressed-tensors' format.

The weights of every ``nn.Linear`` (the LM head too, unless ``lm_head=False``) become int8 with one
scale per output channel, symmetric: ``scale = max|w| / 127.5`` and ``q = clamp(round(w / scale),
-128, 127)``, compressed-tensors' own rule for its ``W8A8`` preset (``calculate_qparams`` of
compressed-tensors 0.17). Activations are quantized per token at run time, so no calibration set is
read. :func:`rtn_int8` is the one place the rule is computed, for the checkpoint and for LMI-Dist's
quantization at load (``option.quantize=w8a8`` on an unquantized folder), so both give the same int8
weights.

The checkpoint is compressed-tensors' ``int-quantized`` format, which vLLM and transformers read: the
scheme is built with compressed-tensors' API (``QuantizationConfig`` from its ``W8A8`` preset, applied to
the model, compressed by its ``ModelCompressor``, which also writes ``quantization_config`` into
config.json). llm-compressor, the library that usually drives it, is not used: it pins transformers
<= 5.17 and compressed-tensors 0.19, and this environment (and vLLM 0.32) has transformers 5.19 and
compressed-tensors 0.17; RTN W8A8 needs nothing from it but what compressed-tensors has.

A tied LM head (SmolLM2 shares it with the input embedding) stays tied in int8: one int8 matrix with
one scale per row (per output channel of the head, per token of the embedding) is both, stored once
(``model.embed_tokens.weight``; ``tie_word_embeddings`` stays true). compressed-tensors says so in its
own terms: a second config group targets ``Embedding`` with the same int8 per-channel weights and no
input activations (a lookup has none), beside the ``Linear`` group, whose W8A8 scheme covers the head.
Both groups round the same matrix by the same rule, so the two int8 copies the compressor makes are
equal and are tied again before saving. transformers reads it (the lookup gives the rows dequantized,
``q * scale``); LMI-Dist serves the head on its int8 GEMM and the lookup on the int8 rows
(:mod:`lmforge.engines.lmi_dist.cpu_linear`). SmolLM2-135M: 0.46x -> 0.25x the fp32 weight bytes. With
``lm_head=False`` (a folder vLLM serves: vLLM 0.32 loads no quantized head or embedding) both stay
float and tied; GPTQ (int4) unties a tied head it quantizes, the embedding staying float.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.models.files import make_readable
from lmforge.quantize import MANIFEST, QuantizeError, method
from lmforge.quantize.start_check import library_versions, weight_files

if TYPE_CHECKING:
    import torch

#: what a compiled folder never carries over from its source (written anew or not needed)
_SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_SKIP_NAMES = {"config.json", "generation_config.json", "model.safetensors.index.json", "lmforge-compiled"}
#: method -> compressed-tensors' checkpoint format
FORMATS = {"w8a8": "int-quantized", "gptq": "pack-quantized"}
#: method -> the manifest's description of its weights and activations (given the group size)
DESCRIPTIONS: dict[str, Callable[[int | None], dict[str, str]]] = {
    "w8a8": lambda _g: {
        "weights": "int8 per output channel, symmetric, round to nearest (scale = max|w| / 127.5)",
        "activations": "int8 per token, symmetric, dynamic (quantized at run time)",
    },
    "gptq": lambda g: {
        "weights": f"int4 in groups of {g} input channels, symmetric (scale = max|w| / 7.5), values chosen "
        "by GPTQ on the calibration set (damping 0.01, Hessians from one full-precision pass)",
        "activations": "float (weight-only)",
    },
}


def rtn_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` (out x in, float) as int8 and its float32 scale per output channel (out x 1)."""
    import torch

    w = weight.detach().float()
    scale = w.abs().amax(dim=1, keepdim=True) / 127.5
    scale = torch.where(scale == 0, torch.finfo(torch.float32).eps, scale)
    return torch.round(w / scale).clamp_(-128, 127).to(torch.int8), scale


def weights_digest(model_dir: Path) -> str:
    """sha256 over the folder's weight files (names and bytes, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file() and p.name.endswith(_SKIP_SUFFIXES)):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def quantize_folder(
    source: Path,
    output: Path,
    *,
    method_name: str = "w8a8",
    lm_head: bool = True,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Write ``source`` (a Hugging Face model folder) quantized to ``output``; returns the manifest.

    The folder is built beside ``output`` under a temporary name and renamed into place at the end, so
    a failure leaves no half-written ``output`` (and ``source`` is only read)."""
    chosen = method(method_name, option="--quantize")
    output = output.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    started = time.monotonic()
    try:
        manifest = _write(source, partial, chosen.name, chosen.scheme, lm_head, progress)
        manifest["seconds"] = round(time.monotonic() - started, 1)
        manifest["files"] = weight_files(partial)  # what lmforge serve checks at every start
        (partial / MANIFEST).parent.mkdir(parents=True, exist_ok=True)
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        make_readable(partial)  # served by other users too: the images' server, a mounted folder
        if output.exists():
            shutil.rmtree(output)
        os.replace(partial, output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return manifest


def _write(
    source: Path, target: Path, name: str, scheme: str, lm_head: bool, progress: Callable[[str], None]
) -> dict[str, Any]:
    import torch
    from compressed_tensors.compressors import ModelCompressor  # type: ignore[import-untyped]
    from compressed_tensors.quantization import (  # type: ignore[import-untyped]
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from transformers import AutoModelForCausalLM

    from lmforge.quantize import EMBEDDING_TARGETS, quantization_config

    if quantization_config(source) is not None:
        raise QuantizeError(
            f"--quantize {name}: {source} is already quantized (config.json quantization_config)"
        )
    progress(f"loading {source} (fp32)")
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    model.eval()
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    tied = head is not None and embedding is not None and head.weight is embedding.weight
    untied = tied_int8 = False
    if lm_head and tied and name == "gptq":  # an int4 head of its own; the embedding stays float
        head.weight = torch.nn.Parameter(embedding.weight.detach().clone(), requires_grad=False)
        for cfg in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
            cfg.tie_word_embeddings = False
        untied = True
    elif lm_head and tied:
        tied_int8 = True  # one int8 matrix: the head's (Linear group) and the embedding's (Embedding group)
    scheme_obj = preset_name_to_scheme(scheme, ["Linear"])
    targets = [
        n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and (lm_head or m is not head)
    ]
    if not targets:
        raise QuantizeError(f"--quantize {name}: {source} has no linear layers to quantize")
    found: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    calibration = None
    group = None
    if name == "gptq":
        from transformers import AutoTokenizer

        from lmforge.quantize import gptq
        from lmforge.quantize.calibration import fingerprint, load_prompts

        modules = dict(model.named_modules())
        group = gptq.group_size_for(modules[n].in_features for n in targets)
        scheme_obj = scheme_obj.model_copy(
            update={"weights": scheme_obj.weights.model_copy(update={"group_size": group})}
        )
        label, count_prompts, digest = fingerprint("")
        sequences = gptq.calibration_ids(AutoTokenizer.from_pretrained(str(source)), load_prompts(""))
        calibration = {
            "set": label,
            "prompts": count_prompts,
            "sha256": digest,
            "sequences": len(sequences),
            "tokens": sum(len(s) for s in sequences),
            "seq_len": gptq.SEQ_LEN,
        }
        progress(f"calibrating on {label}: {count_prompts} prompts, {calibration['tokens']} tokens")
        hessians = gptq.hessians(model, targets, sequences, progress)
        for number, n in enumerate(targets, 1):
            found[n] = gptq.gptq_int4(modules[n].weight, hessians.pop(n), group)
            if number % 20 == 0 or number == len(targets):
                progress(f"GPTQ: {number}/{len(targets)} linear layers")
    fmt = FORMATS[name]
    # each group names its format (compressed-tensors would infer pack-quantized for the embedding's
    # weight-only int8, and warn when one format is forced on every module)
    groups = {"group_0": scheme_obj.model_copy(update={"format": fmt})}
    if tied_int8:
        groups["group_1"] = QuantizationScheme(
            targets=list(EMBEDDING_TARGETS), weights=scheme_obj.weights.model_copy(), format=fmt
        )
    config = QuantizationConfig(
        config_groups=groups,
        ignore=[] if lm_head else ["lm_head"],
        quantization_status=QuantizationStatus.FROZEN,
    )
    apply_quantization_config(model, config)
    count = 0
    with torch.no_grad():
        for module_name, module in model.named_modules():
            if getattr(module, "quantization_scheme", None) is None:
                continue
            if name == "gptq":
                q, scale = found[module_name]
                assert group is not None
                out_features, width = q.shape
                values = q.float().view(out_features, width // group, group) * scale[..., None]
                # q * scale: the compressor's round(w / scale) gives back q
                module.weight.data.copy_(values.view(out_features, width))
            else:
                _q, scale = rtn_int8(module.weight)
            module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype).view_as(module.weight_scale))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.zero_()
            count += 1
    layers = count - (1 if tied_int8 else 0)  # the embedding is counted apart
    progress(
        f"quantizing {layers} linear layers ({scheme}, compressed-tensors {fmt})"
        + (", the LM head tied to the input embedding (one int8 matrix)" if tied_int8 else "")
    )
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    if tied_int8:
        _retie(model, name)
    for path in source.iterdir():
        if path.name in _SKIP_NAMES or path.name.endswith(_SKIP_SUFFIXES):
            continue
        if path.name == "serving.properties":
            _write_properties(path, target / path.name, name)
        elif path.is_dir():
            shutil.copytree(path, target / path.name)
        else:
            shutil.copy2(path, target / path.name)
    model.save_pretrained(str(target))
    compressor.update_config(str(target))
    if (source / "generation_config.json").is_file() and not (target / "generation_config.json").is_file():
        shutil.copy2(source / "generation_config.json", target / "generation_config.json")
    before = sum(p.stat().st_size for p in source.iterdir() if p.name.endswith(".safetensors"))
    after = sum(p.stat().st_size for p in target.iterdir() if p.name.endswith(".safetensors"))
    progress(f"weights {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB")
    head_kind = "int4" if name == "gptq" else "int8"
    if tied_int8:
        head_text = f"{head_kind}, tied to the input embedding (one int8 matrix, one scale per row)"
        embedding_text = (
            "int8, one scale per row, symmetric: the LM head's matrix (tied), looked up and dequantized "
            "(row * its scale) in float32"
        )
    else:
        head_text = (
            f"{head_kind} (untied from the input embedding)" if untied else (head_kind if lm_head else "fp32")
        )
        embedding_text = "fp32" + (" (tied to the LM head)" if tied else "")
    return {
        "method": name,
        "scheme": scheme,
        "format": f"compressed-tensors {fmt}",
        **DESCRIPTIONS[name](group),
        "lm_head": head_text,
        "embedding": embedding_text,
        "layers": layers,
        "source": {"path": str(source.resolve()), "weights": weights_digest(source)},
        "calibration": calibration,
        "weight_bytes": {"source": before, "quantized": after},
        "libraries": library_versions(),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _retie(model: Any, name: str) -> None:
    """Tie the LM head to the input embedding again after compression, which gave each its own int8
    copy of the one matrix (equal: the same weights rounded by the same rule), so it is saved once."""
    import torch

    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    pairs = (
        ("weight", head.weight, embedding.weight),
        ("weight_scale", head.weight_scale, embedding.weight_scale),
    )
    for what, a, b in pairs:
        if a.shape != b.shape or not torch.equal(a, b):
            raise QuantizeError(
                f"--quantize {name}: the tied LM head's int8 {what} differs from the input embedding's "
                "after compression; cannot store them as one matrix"
            )
    head.weight = embedding.weight


def _write_properties(source: Path, target: Path, name: str) -> None:
    """The source's serving.properties without option.quantize: the weights are quantized now, and
    engines read the scheme from config.json (vLLM would take the option as a runtime method)."""
    kept = [
        line
        for line in source.read_text(encoding="utf-8").splitlines()
        if line.split("=", 1)[0].strip() != "option.quantize"
    ]
    header = f"# Quantized by `lmforge compile --quantize {name}` (lmforge-compiled/quantize/manifest.json)."
    target.write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
