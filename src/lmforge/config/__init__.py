"""Configuration: ``serving.properties`` and LMI's environment variables, resolved into one typed model."""

from lmforge.config.properties import PropertyEntry, parse_properties
from lmforge.config.schema import ServingConfig
from lmforge.config.sources import ConfigError, ResolvedConfig, Source, load_config

__all__ = [
    "ConfigError",
    "PropertyEntry",
    "ResolvedConfig",
    "ServingConfig",
    "Source",
    "load_config",
    "parse_properties",
]
