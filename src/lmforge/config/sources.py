"""Where configuration comes from, and which source wins.

Precedence, highest first (LMI's rules, written down once):

1. ``SAGEMAKER_STARTUP_TIMEOUT`` (-> ``option.model_loading_timeout``) and
   ``SAGEMAKER_MAX_PAYLOAD_IN_MB`` (-> ``max_request_size``): SageMaker's own settings override the file.
2. ``serving.properties`` in the model folder.
3. ``OPTION_<KEY>`` (-> ``option.<key>``; ``OPTION_ENTRYPOINT`` -> ``option.entryPoint``,
   ``OPTION_ENGINE`` -> ``engine``) and ``SERVING_<KEY>`` (-> ``<key>``, server keys only).
4. Aliases: ``HF_MODEL_ID``, ``HF_REVISION``, ``TENSOR_PARALLEL_DEGREE``, ``PIPELINE_PARALLEL_DEGREE``,
   and TGI's ``HF_MODEL_TRUST_REMOTE_CODE``, ``HF_MODEL_QUANTIZE``, ``MAX_BATCH_SIZE``,
   ``MAX_CONCURRENT_REQUESTS``.
5. The schema's defaults.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from lmforge.config.properties import PropertiesSyntaxError, parse_properties
from lmforge.config.schema import ServingConfig, properties_keys

PROPERTIES_FILE = "serving.properties"

ALIAS_ENV: dict[str, str] = {
    "HF_MODEL_ID": "option.model_id",
    "HF_REVISION": "option.revision",
    "TENSOR_PARALLEL_DEGREE": "option.tensor_parallel_degree",
    "PIPELINE_PARALLEL_DEGREE": "option.pipeline_parallel_degree",
    "HF_MODEL_TRUST_REMOTE_CODE": "option.trust_remote_code",
    "HF_MODEL_QUANTIZE": "option.quantize",
    "MAX_BATCH_SIZE": "option.max_rolling_batch_size",
    "MAX_CONCURRENT_REQUESTS": "job_queue_size",
}
SAGEMAKER_ENV: dict[str, str] = {
    "SAGEMAKER_STARTUP_TIMEOUT": "option.model_loading_timeout",
    "SAGEMAKER_MAX_PAYLOAD_IN_MB": "max_request_size",
}
_RANK = {"default": 0, "alias": 1, "env": 2, "file": 3, "sagemaker": 4}


class ConfigError(Exception):
    """Invalid configuration; ``str(error)`` lists every problem, one per line, with its source."""


@dataclass(frozen=True)
class Source:
    kind: Literal["file", "env", "default", "derived"]
    detail: str

    def __str__(self) -> str:
        return self.detail


@dataclass
class ResolvedConfig:
    config: ServingConfig
    provenance: dict[str, Source]
    """properties key -> where its value came from."""
    warnings: list[str] = field(default_factory=list)
    extra_options: dict[str, str] = field(default_factory=dict)
    """Unknown ``option.*`` keys (without the prefix), kept for backends that know them."""


@dataclass
class _Candidate:
    key: str
    value: str
    source: Source
    rank: int


def _option_env_key(name: str) -> str:
    part = name[len("OPTION_") :]
    if part.upper() == "ENTRYPOINT":
        return "option.entryPoint"
    if part.upper() == "ENGINE":
        return "engine"
    if re.fullmatch(r"[A-Z0-9_]+", part):
        part = part.lower()
    return "option." + part


def _order(source: Source) -> tuple[int, int, str]:
    """Errors are listed file lines first, in order, then environment variables by name."""
    if source.kind == "file":
        return (0, int(source.detail.rsplit(":", 1)[1]), "")
    return (1, 0, source.detail)


def _suggest(key: str, known: list[str]) -> str:
    match = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    return f"; did you mean '{match[0]}'?" if match else ""


def load_config(model_dir: str | Path | None, env: Mapping[str, str] | None = None) -> ResolvedConfig:
    """Resolve a model folder's configuration from its ``serving.properties`` and the environment."""
    environ = os.environ if env is None else env
    keys = properties_keys()  # properties key -> field name
    canonical = {k.lower(): k for k in keys}
    folder = Path(model_dir) if model_dir is not None else None
    candidates: dict[str, _Candidate] = {}
    warnings: list[str] = []
    extra: dict[str, str] = {}
    errors: list[str] = []

    def offer(raw_key: str, value: str, source: Source, rank_name: str) -> None:
        key = canonical.get(raw_key.lower())
        if key is None:
            hint = _suggest(raw_key, sorted(keys))
            warnings.append(f"Unknown key '{raw_key}' ({source}){hint}")
            if raw_key.startswith("option."):
                extra[raw_key[len("option.") :]] = value
            return
        rank = _RANK[rank_name]
        current = candidates.get(key)
        if current is None or rank >= current.rank:
            if current is not None and current.rank == rank and rank_name == "file":
                warnings.append(f"'{key}' is set twice ({current.source} and {source}); using {source}")
            candidates[key] = _Candidate(key, value, source, rank)

    # serving.properties
    if folder is not None:
        path = folder / PROPERTIES_FILE
        if path.exists():
            try:
                text = path.read_text(encoding="utf-8")
                entries = parse_properties(text, PROPERTIES_FILE)
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{path}: cannot read: {exc}") from None
            except PropertiesSyntaxError as exc:
                raise ConfigError(str(exc)) from None
            for entry in entries:
                offer(
                    entry.key, entry.value.strip(), Source("file", f"{PROPERTIES_FILE}:{entry.line}"), "file"
                )

    # environment
    server_keys = {k for k in keys if not k.startswith("option.")} - {"engine"}
    for name in sorted(environ):
        value = environ[name]
        if name.startswith("OPTION_") and len(name) > len("OPTION_"):
            offer(_option_env_key(name), value, Source("env", name), "env")
        elif name.startswith("SERVING_"):
            key = name[len("SERVING_") :].lower()
            if key in server_keys:
                offer(key, value, Source("env", name), "env")
        elif name in ALIAS_ENV:
            offer(ALIAS_ENV[name], value, Source("env", name), "alias")
        elif name in SAGEMAKER_ENV:
            if name == "SAGEMAKER_MAX_PAYLOAD_IN_MB":
                try:
                    value = str(int(float(value) * 2**20))
                except ValueError:
                    errors.append(f"{name} = {value!r}: expected a number of megabytes")
                    continue
            offer(SAGEMAKER_ENV[name], value, Source("env", name), "sagemaker")

    data: dict[str, object] = {keys[c.key]: c.value for c in candidates.values()}
    data["model_dir"] = folder
    by_field = {keys[c.key]: c for c in candidates.values()}
    config = None
    located: list[tuple[tuple[int, int, str], str]] = []
    try:
        config = ServingConfig.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            name = str(err["loc"][0]) if err["loc"] else ""
            cand = by_field.get(name)
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            msg = msg[:1].lower() + msg[1:]
            if cand is not None:
                located.append((_order(cand.source), f"{cand.source}: {cand.key} = {cand.value!r}: {msg}"))
            else:
                located.append(((2, 0, ""), msg))
    errors += [msg for _, msg in sorted(located)]
    if errors:
        raise ConfigError("\n".join(dict.fromkeys(errors)))
    assert config is not None
    provenance = {
        key: (candidates[key].source if key in candidates else Source("default", "default")) for key in keys
    }
    return ResolvedConfig(config=config, provenance=provenance, warnings=warnings, extra_options=extra)
