"""The error of the Hugging Face readers."""

from __future__ import annotations


class ModelFileError(Exception):
    """A model file that cannot be read (no, unreadable or malformed ``config.json`` or safetensors
    header); the message names the file and what is wrong."""
