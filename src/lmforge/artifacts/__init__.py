"""Model artifacts: deterministic packaging (``model.tar.gz`` with a manifest) and safe extraction."""

from lmforge.artifacts.package import (
    MANIFEST_NAME,
    PackageError,
    PackageResult,
    PackedFile,
    manifest_bytes,
    package_model,
    safe_extract,
    scan_model_folder,
    verify_folder,
)

__all__ = [
    "MANIFEST_NAME",
    "PackageError",
    "PackageResult",
    "PackedFile",
    "manifest_bytes",
    "package_model",
    "safe_extract",
    "scan_model_folder",
    "verify_folder",
]
