"""Where configuration comes from, and which source wins.

Precedence, highest first (LMI's rules):

1. `SAGEMAKER_STARTUP_TIMEOUT` (-> `option.model_loading_timeout`) and `SAGEMAKER_MAX_PAYLOAD_IN_MB`
   (-> `max_request_size`, megabytes x 1024 x 1024): SageMaker's own settings override even the file,
   as LMI overwrites with them.
2. `serving.properties` in the model folder. When a key appears twice, the later line wins (with a
   warning).
3. `OPTION_<KEY>` -> `option.<key>`, the key lower-cased when it is all capitals (`OPTION_entryPoint`
   keeps its case; `OPTION_ENTRYPOINT` -> `option.entryPoint`, `OPTION_ENGINE` -> `engine`), and
   `SERVING_<KEY>` -> `<key>` lower-cased, for the server keys `job_queue_size`,
   `max_request_size` and `shutdown_timeout` only (other `SERVING_*` variables are left to the tools
   they belong to).
4. Alias variables: `HF_MODEL_ID`, `HF_REVISION`, `TENSOR_PARALLEL_DEGREE`, `PIPELINE_PARALLEL_DEGREE`
   and TGI's `HF_MODEL_TRUST_REMOTE_CODE`, `HF_MODEL_QUANTIZE`, `MAX_BATCH_SIZE`,
   `MAX_CONCURRENT_REQUESTS`. When an `OPTION_*`/`SERVING_*` variable sets the same key, it wins.
5. The schema's defaults.

Keys are case-sensitive, as in Java. An unknown `option.*` key (from the file or an `OPTION_*`
variable) gives a warning with a "did you mean" hint and is passed to the backend as an extra
option; other unknown keys in the file give the warning and are dropped. An empty value of an
optional key means unset.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from lmforge.config.describe import expectation, properties_keys
from lmforge.config.properties import PropertiesSyntaxError, parse_properties
from lmforge.config.schema import ServingConfig

PROPERTIES_FILE = "serving.properties"

#: Alias variables (LMI's and TGI's) -> properties key; below OPTION_*/SERVING_* and the file.
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
#: SageMaker's variables -> properties key; these override the file.
SAGEMAKER_ENV: dict[str, str] = {
    "SAGEMAKER_STARTUP_TIMEOUT": "option.model_loading_timeout",
    "SAGEMAKER_MAX_PAYLOAD_IN_MB": "max_request_size",
}
_Layer = Literal["alias", "env", "file", "sagemaker"]
_RANK: dict[_Layer, int] = {"alias": 1, "env": 2, "file": 3, "sagemaker": 4}
_CAPITALS = re.compile(r"[A-Z0-9_]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class ConfigError(Exception):
    """Invalid configuration; ``str(error)`` lists every problem, one per line, each with its source."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.problems: list[str] = message.splitlines()


@dataclass(frozen=True)
class Source:
    """Where a value came from: ``file`` (``serving.properties:7``), ``env`` (the variable's name),
    ``default`` or ``derived``."""

    kind: Literal["file", "env", "default", "derived"]
    detail: str

    def __str__(self) -> str:
        return self.detail


DEFAULT = Source("default", "default")


@dataclass
class ResolvedConfig:
    config: ServingConfig
    provenance: dict[str, Source]
    """properties key -> where its value came from: every schema key, and every extra option
    (as ``option.<key>``)."""
    warnings: list[str] = field(default_factory=list)
    extra_options: dict[str, str] = field(default_factory=dict)
    """Unknown ``option.*`` keys (without the prefix) -> raw value, for backends that know them."""


@dataclass(frozen=True)
class _Setting:
    key: str
    value: str
    raw: str  # what the user wrote (differs from value for SAGEMAKER_MAX_PAYLOAD_IN_MB)
    source: Source
    rank: int


def env_key(name: str) -> tuple[str, _Layer] | None:
    """The properties key an environment variable sets and its precedence layer, or None.

    ``SERVING_*`` variables that do not name a server key of the schema give None.
    """
    if name in SAGEMAKER_ENV:
        return SAGEMAKER_ENV[name], "sagemaker"
    if name in ALIAS_ENV:
        return ALIAS_ENV[name], "alias"
    if name.startswith("OPTION_") and len(name) > len("OPTION_"):
        part = name[len("OPTION_") :]
        if _CAPITALS.fullmatch(part):
            part = part.lower()
        if part == "entrypoint":
            return "option.entryPoint", "env"
        if part == "engine":
            return "engine", "env"
        return "option." + part, "env"
    if name.startswith("SERVING_"):
        key = name[len("SERVING_") :].lower()
        if key in _server_keys():
            return key, "env"
    return None


def _server_keys() -> set[str]:
    # engine is a per-model key: LMI takes it from the file or OPTION_ENGINE, never SERVING_ENGINE
    return {k for k in properties_keys() if not k.startswith("option.")} - {"engine"}


def suggest(key: str) -> str | None:
    """The known key closest to ``key``, or None when none is close.

    Names are compared case-insensitively and without the ``option.`` prefix, which every option
    key shares and which would make unrelated keys look alike.
    """
    known = properties_keys()
    folded = {k.lower(): k for k in known}
    if key.lower() in folded:
        return folded[key.lower()]
    bare: dict[str, str] = {}
    for k in known:  # an option key wins over a server key of the same bare name
        bare.setdefault(k.lower().removeprefix("option."), k)
    match = difflib.get_close_matches(key.lower().removeprefix("option."), list(bare), n=1, cutoff=0.75)
    return bare[match[0]] if match else None


class _Collector:
    def __init__(self) -> None:
        self.known = properties_keys()
        self.settings: dict[str, _Setting] = {}
        self.warnings: list[str] = []
        self.errors: list[tuple[tuple[int, int, str], str]] = []

    def offer(self, key: str, value: str, source: Source, layer: _Layer, raw: str | None = None) -> None:
        if key not in self.known:
            hint = suggest(key)
            self.warnings.append(
                f"Unknown key '{key}' ({source})" + (f"; did you mean '{hint}'?" if hint else "")
            )
            if not key.startswith("option."):
                return
        setting = _Setting(key, value.strip(), value if raw is None else raw, source, _RANK[layer])
        current = self.settings.get(key)
        if current is not None and current.rank == setting.rank:
            self.warnings.append(f"'{key}' is set twice ({current.source} and {source}); using {source}")
        if current is None or setting.rank >= current.rank:
            self.settings[key] = setting

    def error(self, source: Source | None, message: str) -> None:
        self.errors.append((_order(source), message))


def _order(source: Source | None) -> tuple[int, int, str]:
    """Errors are listed file lines first, in order, then environment variables by name, then the rest."""
    if source is None:
        return (2, 0, "")
    if source.kind == "file":
        return (0, int(source.detail.rsplit(":", 1)[1]), "")
    return (1, 0, source.detail)


def _read_file(path: Path, collector: _Collector) -> None:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {PROPERTIES_FILE}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{PROPERTIES_FILE}:{line}: cannot read {path}: not UTF-8 text "
            f"(byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        entries = parse_properties(text, PROPERTIES_FILE)
    except PropertiesSyntaxError as exc:
        raise ConfigError(str(exc)) from None
    for entry in entries:
        collector.offer(entry.key, entry.value, Source("file", f"{PROPERTIES_FILE}:{entry.line}"), "file")


def _read_env(environ: Mapping[str, str], collector: _Collector) -> None:
    for name in sorted(environ):
        mapped = env_key(name)
        if mapped is None:
            continue
        key, layer = mapped
        value = environ[name]
        source = Source("env", name)
        if name == "SAGEMAKER_MAX_PAYLOAD_IN_MB":
            text = value.strip()
            megabytes = float(text) if _NUMBER.fullmatch(text) else 0.0
            size = int(megabytes * 1024 * 1024) if math.isfinite(megabytes) else 0
            if size < 1:
                collector.error(source, f"{name}: {key} = {value!r}: expected a number of megabytes > 0")
                continue
            collector.offer(key, str(size), source, layer, raw=value)
        else:
            collector.offer(key, value, source, layer)


def _validation_errors(exc: ValidationError, collector: _Collector) -> None:
    by_field = {collector.known[s.key]: s for s in collector.settings.values() if s.key in collector.known}
    field_keys = {name: key for key, name in collector.known.items()}
    reported: set[str] = set()
    for err in exc.errors(include_url=False):
        name = str(err["loc"][0]) if err["loc"] else ""
        if name in reported:
            continue  # a union gives one error per alternative: one line per key is enough
        setting = by_field.get(name)
        if name in field_keys:
            reported.add(name)
            expected = f"expected {expectation(name)}"
            if err["type"] == "lmforge_detail":
                expected += f" ({err['msg']})"
            elif err["type"] == "value_error":
                expected = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
            if setting is None:  # a default that does not validate: a bug in the schema
                collector.error(None, f"{field_keys[name]} (default): {expected}")
            else:
                collector.error(
                    setting.source, f"{setting.source}: {setting.key} = {setting.raw!r}: {expected}"
                )
        else:  # a check across keys: name the sources of the keys it mentions
            message = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
            words = set(re.findall(r"[\w.]+", message))
            mentioned = sorted(
                (s.source for key, s in collector.settings.items() if key in words), key=_order
            )
            prefix = ", ".join(str(source) for source in mentioned)
            collector.error(None, f"{prefix}: {message}" if prefix else message)


def load_config(model_dir: str | Path | None, env: Mapping[str, str] | None = None) -> ResolvedConfig:
    """Resolve a model folder's configuration from its ``serving.properties`` and the environment.

    ``env=None`` reads ``os.environ``. Raises :class:`ConfigError` listing every invalid value.
    """
    environ = os.environ if env is None else env
    folder = Path(model_dir) if model_dir is not None else None
    collector = _Collector()
    if folder is not None:
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"{folder}: not a folder (give the model folder that holds {PROPERTIES_FILE})")
        path = folder / PROPERTIES_FILE
        if path.exists() or path.is_symlink():
            _read_file(path, collector)
    _read_env(environ, collector)

    known = {s.key: s for s in collector.settings.values() if s.key in collector.known}
    extra = {s.key: s for s in collector.settings.values() if s.key not in collector.known}
    data: dict[str, object] = {collector.known[key]: s.value for key, s in known.items()}
    data["model_dir"] = folder
    config: ServingConfig | None = None
    try:
        config = ServingConfig.model_validate(data)
    except ValidationError as exc:
        _validation_errors(exc, collector)
    if collector.errors or config is None:
        messages = [message for _, message in sorted(collector.errors, key=lambda e: e[0])]
        raise ConfigError("\n".join(dict.fromkeys(messages)) or "invalid configuration")

    provenance = {key: known[key].source if key in known else DEFAULT for key in collector.known}
    provenance.update({key: s.source for key, s in extra.items()})
    return ResolvedConfig(
        config=config,
        provenance=provenance,
        warnings=collector.warnings,
        extra_options={key[len("option.") :]: s.value for key, s in extra.items()},
    )
