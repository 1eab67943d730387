"""Model artifacts: deterministic packaging (``model.tar.gz`` with a manifest) and safe extraction."""

from lmforge.artifacts.package import MANIFEST_NAME, PackageError, package_model, safe_extract

__all__ = ["MANIFEST_NAME", "PackageError", "package_model", "safe_extract"]
