"""Every top-level name defined in lmforge is used somewhere: dead code does not come back.

A function, class or module-level constant of ``src/lmforge`` whose name appears nowhere else in the
project (source, tests, benchmarks, examples, templates, container files, docs, pyproject) is dead: it
is reported with its module and line. Names a module exports (``__all__``) and dunders are API, not
dead code, and a decorated function or class is registered by its decorator (a click command). A name
that is only read through a string (``getattr``, an entry point, a template) is found
by the same text search, so it counts as used.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "lmforge"
SEARCHED = ("src", "tests", "bench", "examples", "templates", "containers", "docs")
SUFFIXES = {".py", ".j2", ".md", ".toml", ".sh", ".txt", ".cfg", ".yaml", ".yml", ".json", ".c", ""}
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _defined(tree: ast.Module) -> list[tuple[str, int]]:
    names: list[tuple[str, int]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if not node.decorator_list:  # a decorator registers what it decorates (click, a plugin hook)
                names.append((node.name, node.lineno))
        elif isinstance(node, ast.Assign):
            names += [(t.id, node.lineno) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            names.append((node.target.id, node.lineno))
    return names


def _exported(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return set()
    return set()


def test_no_top_level_name_is_unreferenced() -> None:
    counts: Counter[str] = Counter()
    files = [ROOT / "pyproject.toml", ROOT / "Makefile", ROOT / "README.md", ROOT / "setup.py"]
    for folder in SEARCHED:
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    for path in files:
        if "__pycache__" in path.parts:
            continue
        counts.update(WORD.findall(path.read_text(errors="replace")))
    dead = []
    for module in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(module.read_text())
        exported = _exported(tree)
        for name, line in _defined(tree):
            if name.startswith("__") or name in exported:
                continue
            if counts[name] <= 1:  # its own definition only
                dead.append(f"{module.relative_to(ROOT)}:{line}: {name}")
    assert not dead, "top-level names nothing refers to (remove them, or use them):\n" + "\n".join(dead)
