"""The draft-model proposer of LMI-Dist's speculative decoding (``method: draft_model``).

A smaller model with the target's tokenizer, loaded by the engine core (and by every tensor-parallel
rank, each a whole copy: its proposals are greedy, a pure function of the request's tokens, so every
rank schedules the same drafts). It runs on the generation thread, inside the step's scheduling
(:meth:`.speculative.Speculator.schedule_batch`), before the target's forward.

Each request it proposes for has its own KV cache (transformers' ``DynamicCache``) and the list of
tokens whose keys that cache holds. To propose up to k tokens after the request's prompt and output:

1. the cache is cut back (``DynamicCache.crop``) to the longest prefix its tokens share with the
   request's tokens: after a step whose drafts were partly rejected, the rejected drafts' keys go,
   exactly as the target's positions are rolled back;
2. the tokens the cache lacks (the prompt at first sight; then the last step's accepted tokens and
   the target's own next one) go through the draft model in one forward, and its greedy choice is d1;
3. d1, d2, ... each go through it in turn, up to dk (the last draft is never fed: the next step feeds
   it if it was accepted); the proposal stops early at a token the draft is unsure of
   (:data:`CONFIDENCE`).

At most ``disable_by_batch_size`` requests keep a cache (the steps with more decoding requests do not
speculate); the least recently used is dropped for a new one and rebuilt from the tokens if it comes
back. Checked at start, each naming ``option.speculative_config``: the draft's tokenizer has the
target's vocabulary and special tokens and its logits the target's width; its weights and the KV
caches it may hold fit in the memory free after the target's load.
"""

from __future__ import annotations

import json
import logging
import struct
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from array import array

    from lmforge.config import ServingConfig

log = logging.getLogger("lmforge.engines.lmi_dist")

_OPTION = "option.speculative_config"
_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
CONFIDENCE = 0.4
"""A proposal stops at a draft token the draft itself gives less than this probability (the first
token is always proposed): a draft forward pass is not free, and an unsure draft is mostly rejected
(transformers' assisted generation stops its drafts at the same confidence)."""
MEMORY_SHARE = 0.9
"""The share of the memory free after the target's load that the draft (weights + caches) may take."""


class DraftModelError(RuntimeError):
    """The draft model failed mid-run: the generation loop stops with it, as on any fatal step error."""


def weight_bytes(folder: Path, element_bytes: int) -> int:
    """The bytes the draft's weights take once loaded with ``element_bytes`` per floating value, read
    from the safetensors headers (no weights are read)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise LmforgeError(f"{_OPTION}: model={folder} has no *.safetensors weights")
    total = 0
    for file in files:
        with file.open("rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise LmforgeError(f"{_OPTION}: model={folder}: {file.name} is not a safetensors file")
            (size,) = struct.unpack("<Q", head)
            try:
                header = json.loads(f.read(size))
            except (ValueError, UnicodeDecodeError):
                raise LmforgeError(
                    f"{_OPTION}: model={folder}: {file.name} is not a safetensors file"
                ) from None
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info.get("shape", ()):
                count *= int(dim)
            dtype = str(info.get("dtype", "F32"))
            floating = dtype in ("F64", "F32", "F16", "BF16")
            total += count * (element_bytes if floating else _SAFETENSORS_BYTES.get(dtype, 4))
    return total


def check_tokenizer(draft: Any, target: Any, folder: Path) -> None:
    """The draft's tokenizer must be the target's: the same token ids for the same strings, and the
    same special tokens."""
    mine, theirs = draft.get_vocab(), target.get_vocab()
    if mine != theirs:
        only = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
        raise LmforgeError(
            f"{_OPTION}: model={folder} has another tokenizer than the target's (vocabulary of {len(mine)} "
            f"tokens against {len(theirs)}; differ at {only}): a draft model must share the target's "
            "tokenizer"
        )
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(draft, attr, None), getattr(target, attr, None)
        if a != b:
            raise LmforgeError(
                f"{_OPTION}: model={folder} has another tokenizer than the target's ({attr} {a} against "
                f"{b}): a draft model must share the target's tokenizer"
            )


@dataclass
class _State:
    cache: Any
    tokens: list[int]
    """The tokens whose keys ``cache`` holds, in order."""


class DraftModel:
    """A draft model and its per-request caches (see the module's docstring)."""

    def __init__(
        self, config: ServingConfig, folder: str, target: Any, target_tokenizer: Any, slots: int
    ) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from lmforge.config.speculative import draft_folder
        from lmforge.engines.memory import available_memory_bytes, kv_bytes_per_token

        path = draft_folder(folder, config.model_dir)
        if not (path / "config.json").is_file():
            raise LmforgeError(f"{_OPTION}: model={folder} is not a model folder (no config.json)")
        self.path = path
        trust = config.trust_remote_code
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust)
        check_tokenizer(tokenizer, target_tokenizer, path)
        draft_cfg = AutoConfig.from_pretrained(str(path), trust_remote_code=trust).get_text_config()
        target_vocab = int(target.config.get_text_config().vocab_size)
        if int(draft_cfg.vocab_size) != target_vocab:
            raise LmforgeError(
                f"{_OPTION}: model={folder} scores {draft_cfg.vocab_size} tokens, the target "
                f"{target_vocab}: a draft model must have the target's vocabulary"
            )
        dtype = target.dtype
        element = torch.finfo(dtype).bits // 8
        heads = draft_cfg.num_attention_heads
        head_dim = getattr(draft_cfg, "head_dim", None) or draft_cfg.hidden_size // heads
        per_token = kv_bytes_per_token(
            num_layers=draft_cfg.num_hidden_layers,
            num_kv_heads=getattr(draft_cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            dtype_bytes=element,
        )
        max_len = config.max_model_len or int(getattr(draft_cfg, "max_position_embeddings", 0) or 2048)
        weights = weight_bytes(path, element)
        caches = per_token * max_len * slots
        device = target.device
        free = int(torch.cuda.mem_get_info(device)[0]) if device.type == "cuda" else available_memory_bytes()
        if weights + caches > MEMORY_SHARE * free:
            need = (weights + caches) / 2**20
            raise LmforgeError(
                f"{_OPTION}: model={folder} does not fit in memory: it needs {need:,.0f} MiB (weights "
                f"{weights / 2**20:,.0f} MiB + KV caches of {slots} requests x {max_len} tokens "
                f"{caches / 2**20:,.0f} MiB) and {free / 2**20:,.0f} MiB is free after the target's load "
                f"({MEMORY_SHARE:.0%} of it may be used); use a smaller draft, lower "
                "disable_by_batch_size or option.max_model_len"
            )
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=trust)
        model = model.to(device).eval()
        if device.type == "cpu":  # a whole copy on every rank, sharded on none: the lean layers apply
            from lmforge.engines.lmi_dist import lean_layers

            lean_layers.install(model, fuse=True)
        self.model = model
        self.device = device
        self.slots = slots
        self.max_len = max_len
        self.states: OrderedDict[str, _State] = OrderedDict()
        self.forwards = 0
        """Forward passes of the draft model since start."""
        log.info(
            "lmi-dist: draft model %s (%d layers, %.0f MiB of weights), KV caches for %d requests",
            path,
            draft_cfg.num_hidden_layers,
            weights / 2**20,
            slots,
        )

    def propose(self, rid: str, tokens: array[int], k: int) -> list[int]:
        """Up to ``k`` greedy draft tokens after ``tokens`` (the request's prompt and output so far)."""
        import torch

        try:
            with torch.inference_mode():
                return self._propose(rid, tokens, k, torch)
        except Exception as exc:
            self.states.pop(rid, None)
            raise DraftModelError(
                f"{_OPTION}: the draft model {self.path} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _propose(self, rid: str, tokens: array[int], k: int, torch: Any) -> list[int]:
        if k <= 0 or not tokens:
            return []
        k = min(k, self.max_len - len(tokens))
        if k <= 0:
            return []
        state = self.states.get(rid)
        if state is None:
            from transformers import DynamicCache

            if len(self.states) >= self.slots:
                self.states.popitem(last=False)  # the least recently used: rebuilt if it comes back
            state = self.states[rid] = _State(DynamicCache(config=self.model.config), [])
        else:
            self.states.move_to_end(rid)
        have = state.tokens
        common = _common_prefix(have, tokens)
        common = min(common, len(tokens) - 1)  # at least the last token is fed
        if common < len(have):
            state.cache.crop(common - len(have))  # a negative length: drop that many from the end
            del have[common:]
        feed = tokens[common:].tolist()
        drafts: list[int] = []
        while True:
            ids = torch.tensor([feed], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, past_key_values=state.cache, use_cache=True, logits_to_keep=1)
            self.forwards += 1
            have.extend(feed)
            scores = out.logits[0, -1]
            token = int(torch.argmax(scores))
            if drafts and float(torch.softmax(scores.float(), dim=-1)[token]) < CONFIDENCE:
                return drafts  # unsure: the next steps' drafts start from the target's own token
            drafts.append(token)
            if len(drafts) >= k:
                return drafts
            feed = [token]

    def forget(self, rid: str) -> None:
        self.states.pop(rid, None)

    def prune(self, active: Any) -> None:
        for rid in [rid for rid in self.states if rid not in active]:
            del self.states[rid]


def _common_prefix(have: list[int], tokens: array[int]) -> int:
    """How many leading tokens ``have`` and ``tokens`` share."""
    n = min(len(have), len(tokens))
    # drafts are rejected in the last <= 16 positions: compare the rest in one go first
    safe = max(0, n - 32)
    if safe and tokens[:safe].tolist() != have[:safe]:
        safe = 0
    for i in range(safe, n):
        if have[i] != tokens[i]:
            return i
    return n
