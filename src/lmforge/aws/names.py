"""SageMaker's rule for resource names (endpoints, endpoint configurations, models, production
variants, inference components): 1 to 63 letters, digits and hyphens, starting and ending with a
letter or digit."""

from __future__ import annotations

import re

NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
_NAME_RE = re.compile(NAME_PATTERN)


def name_problem(field: str, value: object) -> str | None:
    """SageMaker's validation message for a bad name in ``field``, or None when it is valid."""
    if isinstance(value, str) and _NAME_RE.match(value):
        return None
    return (
        f"1 validation error detected: Value '{value}' at '{field}' failed to satisfy constraint: Member "
        "must satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62} (1 to 63 letters, "
        "digits and hyphens)"
    )
