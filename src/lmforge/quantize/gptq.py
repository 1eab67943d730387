"""GPTQ 4-bit weight-only quantization (W4A16), calibrated on lmforge's own offline prompt set.

Each ``nn.Linear``'s weights become int4, symmetric, one float32 scale per group of input channels
(``scale = max|w| / 7.5`` over the group, ``q = clamp(round(w / scale), -8, 7)``: compressed-tensors'
rule for its ``W4A16`` preset), chosen column by column by GPTQ (Frantar et al., 2022): the rounding
error of each column is spread over the columns not yet quantized, weighted by the inverse of the
layer's input Hessian ``H = 2 X^T X``, so that the layer's *output* on the calibration inputs changes
least, not its weights. The scale of a group is taken from the weights as GPTQ has updated them when
it reaches the group's first column (its block is the group, so they are all current).

The Hessians come from one pass of the full-precision model over the calibration set, every linear
layer's inputs recorded at once (hooks), rather than layer by layer through the already-quantized
layers before it, as the reference implementation does: one forward pass instead of one per layer,
for a small loss of accuracy (measured in docs/quantization.md).

The calibration set is the one lmforge ships for TensorRT-LLM's ModelOpt path
(:mod:`lmforge.quantize.calibration`: ~300 short prompts, nothing downloaded), concatenated into
sequences of :data:`SEQ_LEN` tokens. Its digest goes into the manifest.

The group size is the largest of 128, 64 and 32 that divides every quantized layer's input width
(SmolLM2-135M's 576 takes 64); a model with none is refused (``--quantize gptq``: no group size fits).

No quantization library is used for the search: gptqmodel 7.7 would move torch 2.13 -> 2.14 and
transformers 5.19 -> 5.24 (this environment's pins, shared with vLLM 0.32), llm-compressor moves
transformers and compressed-tensors (see :mod:`.w8a8`) and AutoAWQ is archived. The checkpoint is
written by compressed-tensors (``pack-quantized``), as for W8A8.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from lmforge.quantize import QuantizeError

if TYPE_CHECKING:
    import torch

#: tokens per calibration sequence
SEQ_LEN = 512
#: candidate group sizes, largest first
GROUP_SIZES = (128, 64, 32)
#: GPTQ's damping: this share of the Hessian's mean diagonal is added to its diagonal
DAMP = 0.01


def group_size_for(widths: Iterable[int], option: str = "--quantize gptq") -> int:
    """The largest of :data:`GROUP_SIZES` dividing every input width; QuantizeError naming the option."""
    widths = sorted(set(widths))
    for size in GROUP_SIZES:
        if all(w % size == 0 for w in widths):
            return size
    raise QuantizeError(
        f"{option}: no group size of {', '.join(map(str, GROUP_SIZES))} divides every linear layer's "
        f"input width ({', '.join(map(str, widths))}); this model family is not covered by 4-bit groups"
    )


def rtn_int4(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` (out x in) as int4 values (int8 in -8..7) and float32 scales (out x in/group),
    rounded to nearest."""
    import torch

    out, width = weight.shape
    w = weight.detach().float().view(out, width // group, group)
    scale = w.abs().amax(-1) / 7.5
    scale = torch.where(scale == 0, torch.finfo(torch.float32).eps, scale)
    q = torch.round(w / scale[..., None]).clamp_(-8, 7)
    return q.view(out, width).to(torch.int8), scale


def gptq_int4(
    weight: torch.Tensor, hessian: torch.Tensor, group: int, damp: float = DAMP
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ of ``weight`` (out x in) for the input Hessian ``hessian`` (in x in): int4 values (int8 in
    -8..7, out x in) and float32 scales (out x in/group)."""
    import torch

    w = weight.detach().float().clone()
    out, width = w.shape
    h = hessian.double().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += torch.eye(width, dtype=h.dtype) * (damp * torch.diag(h).mean())
    try:
        inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    except RuntimeError:  # not positive definite even damped: round to nearest
        return rtn_int4(weight, group)
    inverse = inverse.float()
    q_all = torch.zeros(out, width, dtype=torch.int8)
    scales = torch.zeros(out, width // group)
    for start in range(0, width, group):
        stop = start + group
        block = w[:, start:stop].clone()
        errors = torch.zeros_like(block)
        hinv = inverse[start:stop, start:stop]
        scale = block.abs().amax(1) / 7.5
        scale = torch.where(scale == 0, torch.finfo(torch.float32).eps, scale)
        scales[:, start // group] = scale
        for i in range(group):
            column = block[:, i]
            q = torch.round(column / scale).clamp_(-8, 7)
            q_all[:, start + i] = q.to(torch.int8)
            error = (column - q * scale) / hinv[i, i]
            block[:, i:] -= error[:, None] * hinv[i, i:][None, :]
            errors[:, i] = error
        w[:, stop:] -= errors @ inverse[start:stop, stop:]
    return q_all, scales


def calibration_ids(tokenizer: Any, prompts: list[str], seq_len: int = SEQ_LEN) -> list[list[int]]:
    """The prompts tokenized, joined by newlines and cut into sequences of ``seq_len`` tokens (the last
    may be shorter)."""
    ids: list[int] = []
    for prompt in prompts:
        ids += tokenizer(prompt + "\n", add_special_tokens=False)["input_ids"]
    return [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]


def hessians(
    model: torch.nn.Module, names: list[str], sequences: list[list[int]], progress: Callable[[str], None]
) -> dict[str, torch.Tensor]:
    """``2 X^T X / n`` of the inputs of each linear layer in ``names`` over the calibration sequences
    (one pass of ``model``)."""
    import torch

    modules = dict(model.named_modules())
    sums: dict[str, torch.Tensor] = {}
    rows: dict[str, int] = {}
    hooks = []

    def record(name: str) -> Callable[..., None]:
        def hook(_module: Any, args: tuple[Any, ...]) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()
            sums[name] = sums[name] + x.t() @ x if name in sums else x.t() @ x
            rows[name] = rows.get(name, 0) + x.shape[0]

        return hook

    for name in names:
        hooks.append(modules[name].register_forward_pre_hook(record(name)))
    try:
        with torch.no_grad():
            for number, seq in enumerate(sequences, 1):
                model(input_ids=torch.tensor([seq]), use_cache=False)
                progress(f"calibration sequence {number}/{len(sequences)} ({len(seq)} tokens)")
    finally:
        for handle in hooks:
            handle.remove()
    missing = [n for n in names if n not in sums]
    if missing:
        raise QuantizeError(f"--quantize gptq: calibration never reached {', '.join(missing[:3])}")
    return {n: (2 * sums[n] / rows[n]).float() for n in names}
