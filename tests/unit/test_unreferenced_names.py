"""Every name defined in lmforge is used somewhere: dead code does not come back.

Defined names are the top-level functions, classes and constants of ``src/lmforge``, the methods of its
classes, and the fields of its dataclasses, msgspec structs and other annotated class bodies. A name is
used when code refers to it: a name, an attribute, a keyword argument or an import in Python anywhere in
the project (source, tests, benchmarks, examples), a string that is an identifier or a dotted path (what
``getattr``, an entry point or a template reads), or a word of the templates, container files, Makefile
and pyproject. Prose does not count: docstrings, comments and docs/ mention names without using them.

Not reported: dunders, names a module exports (``__all__``), what a decorator registers (a click
command, a plugin hook), the fields of pydantic models (a request or config schema: the client's JSON
fills them), and the methods a library calls on the subclasses it defines (:data:`LIBRARY_HOOKS`).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "lmforge"
PYTHON = ("src", "tests", "bench", "examples", "containers")
#: files of other kinds whose words are code: templates, container files, build and CI files
OTHER_CODE = ("templates", "containers")
OTHER_SUFFIXES = {".j2", ".toml", ".sh", ".cfg", ".yaml", ".yml", ".json", ".c", ""}
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[.:][A-Za-z_][A-Za-z0-9_]*)*")
#: decorators that leave a method an ordinary method, called by its name
PLAIN_DECORATORS = {
    "property",
    "staticmethod",
    "classmethod",
    "cached_property",
    "abstractmethod",
    "dataclass",
    "runtime_checkable",
    "total_ordering",
    "final",
}
#: methods a library calls on a subclass lmforge defines (logging handlers, torch modules, http.server,
#: asyncio protocols, threads, JSON encoders, pydantic validators): their callers are not in this tree
LIBRARY_HOOKS = {
    "emit",
    "forward",
    "run",
    "default",
    "do_GET",
    "do_POST",
    "do_PUT",
    "do_DELETE",
    "do_HEAD",
    "log_message",
    "translate_path",
    "fill_defaults",
    "connection_made",
    "data_received",
    "connection_lost",
    "datagram_received",
    "error_received",
    "eof_received",
    "filter",
    "format",
    "handle",
    "setup",
    "finish",
    "find_spec",
    "exec_module",
    "create_module",
    "model_post_init",
}


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def _registered(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """Decorated by something other than :data:`PLAIN_DECORATORS` (a registration)."""
    return any(_decorator_name(d) not in PLAIN_DECORATORS for d in node.decorator_list)


def _bases(node: ast.ClassDef) -> set[str]:
    return {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}


def _class_members(node: ast.ClassDef) -> Iterator[tuple[str, int]]:
    pydantic = bool(_bases(node) & {"BaseModel", "BaseSettings", "RootModel"})
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not _registered(item) and item.name not in LIBRARY_HOOKS:
                yield item.name, item.lineno
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and not pydantic:
            yield item.target.id, item.lineno


def defined(tree: ast.Module) -> list[tuple[str, int]]:
    """The names ``tree`` defines that must be used: top level, methods and class fields."""
    names: list[tuple[str, int]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not _registered(node):
                names.append((node.name, node.lineno))
        elif isinstance(node, ast.ClassDef):
            if not _registered(node):
                names.append((node.name, node.lineno))
            names += list(_class_members(node))
        elif isinstance(node, ast.Assign):
            names += [(t.id, node.lineno) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            names.append((node.target.id, node.lineno))
    return names


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the string constants that are docstrings (a module's, a class's, a function's, and
    attribute docstrings: a bare string statement anywhere)."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def references(source: str) -> Iterator[str]:
    """The names Python ``source`` refers to (not those it defines, and not its prose)."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.keyword) and node.arg is not None:
            yield node.arg
        elif isinstance(node, ast.alias):
            yield from node.name.split(".")
            if node.asname:
                yield node.asname
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            text = node.value.strip()
            if PATH.fullmatch(text):
                yield from WORD.findall(text)
        elif isinstance(node, ast.MatchClass):
            yield from node.kwd_attrs


def used_names() -> Counter[str]:
    counts: Counter[str] = Counter()
    for folder in PYTHON:
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                counts.update(references(path.read_text()))
    others = [ROOT / "pyproject.toml", ROOT / "Makefile", ROOT / "setup.py", *(ROOT / ".ci").glob("*")]
    for folder in OTHER_CODE:
        others += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in OTHER_SUFFIXES]
    for path in others:
        if path.is_file():
            counts.update(WORD.findall(path.read_text(errors="replace")))
    return counts


def unreferenced() -> list[str]:
    used = used_names()
    dead = []
    for module in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(module.read_text())
        exported = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                exported = set(ast.literal_eval(node.value))
        for name, line in defined(tree):
            if name.startswith("__") or name in exported:
                continue
            if not used[name]:
                dead.append(f"{module.relative_to(ROOT)}:{line}: {name}")
    return dead


def test_no_name_is_unreferenced() -> None:
    dead = unreferenced()
    assert not dead, "names nothing refers to (remove them, or use them):\n" + "\n".join(dead)


def test_the_check_sees_methods_and_fields_and_not_prose() -> None:
    source = '''
"""Mentions used_in_prose_only."""
from dataclasses import dataclass


@dataclass
class Record:
    kept: int
    dropped: int
    """dropped is named here only"""

    def called(self) -> int:
        return self.kept

    def never_called(self) -> None:  # never_called, in a comment
        pass


def top() -> None:
    Record(kept=1, dropped=2).called()
'''
    tree = ast.parse(source)
    names = {name for name, _ in defined(tree)}
    assert {"Record", "kept", "dropped", "called", "never_called", "top"} <= names
    refs = set(references(source))
    assert {"kept", "called", "Record", "dropped"} <= refs
    assert "never_called" not in refs and "used_in_prose_only" not in refs
