"""The package's layers, and no import cycles.

Every module imports only from its own layer or the ones below it (imports under ``if
TYPE_CHECKING:`` are type references, not dependencies, and are not counted there); no lmforge
modules import each other in a circle, counting every import: at module level, inside functions
(lazy) and under ``if TYPE_CHECKING:``, since a circle hidden by a lazy or type-only import is still
two modules that each need the other; and every module imports on its own in a fresh interpreter.
docs/architecture.md draws the same layers.

Where two modules seemed to need each other, the shared piece moved to a module both import
(``handlers.tool_calls``, ``local.exchange``), to its only user (``deploy.plan.memory.compute_dtype``),
or the upper one declares what it needs as a protocol (``serving.bidi.Invocations``). Engines chosen
by name (``engines.registry`` imports the class an entry names with ``importlib``) are plug-ins, not
imports, and are not counted.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "lmforge"

#: top-level package -> layer; a module may import from its layer and the layers below
LAYERS: dict[str, int] = {
    # foundations: no lmforge imports above them
    "__init__": 0,
    "errors": 0,
    "config": 0,
    "aws": 0,
    "hf": 0,
    "artifacts": 0,
    "client": 0,
    "models": 0,
    "process": 0,
    "import_cache": 0,
    "reachins": 0,
    "paths": 0,
    "quantize": 0,
    # LoRA adapters as data and checks
    "adapters": 1,
    # the engine protocol and the backends
    "engines": 2,
    # the djl-python handler layer: request schemas, formatters, default and custom handlers
    "handlers": 3,
    # the HTTP model server
    "serving": 4,
    # what builds, ships and runs the server: images, deployments, the local SageMaker, benchmarks
    "container": 5,
    "deploy": 5,
    "local": 5,
    "bench": 5,
    "testing": 5,
    # the command line
    "cli": 6,
    "__main__": 6,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(("lmforge", *parts)).removesuffix(".__init__")
        out[name] = path
    return out


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The module an import names (``lmforge.x.y`` may be a name inside ``lmforge.x``)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(path: Path, modules: dict[str, Path], *, type_checking: bool) -> set[str]:
    """lmforge modules that ``path`` imports, at module level and inside functions; those under ``if
    TYPE_CHECKING:`` only with ``type_checking``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(_resolve(a.name, modules) for a in node.names if a.name.startswith("lmforge"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lmforge"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(_resolve(full if full in modules else node.module, modules))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (module -> modules it imports), each as ``a -> b -> ... -> a``:
    at least one through every circle there is (a depth-first walk's back edges)."""
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [])
    return cycles


def test_every_package_has_a_layer() -> None:
    packages = {_package(m) for m in _modules()}
    assert packages <= set(LAYERS), f"add to LAYERS: {sorted(packages - set(LAYERS))}"


def test_modules_import_only_from_their_layer_or_below() -> None:
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        mine = LAYERS[_package(name)]
        for target in _imports(path, modules, type_checking=False):
            if LAYERS[_package(target)] > mine:
                wrong.append(f"{name} (layer {mine}) imports {target} (layer {LAYERS[_package(target)]})")
    assert wrong == [], "\n".join(wrong)


def test_no_import_cycles_counting_lazy_and_type_checking_imports() -> None:
    modules = _modules()
    # a package's own ``__init__`` is counted where a submodule imports a name from it: that module
    # runs first, so a circle through it is as real as any other
    graph = {name: _imports(path, modules, type_checking=True) - {name} for name, path in modules.items()}
    cycles = _cycles(graph)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The check above cannot pass by not looking: each kind of import it must count makes an edge."""
    sources = {
        "a": "from lmforge.b import x\n",
        "b": "def f():\n    import lmforge.c.d\n",
        "c/__init__": "",
        "c/d": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lmforge.c import d\n"
        "    from lmforge import a\nelse:\n    from lmforge import e\n",
        "e": "",
    }
    modules = {}
    for name, text in sources.items():
        path = tmp_path / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        modules["lmforge." + name.replace("/", ".").removesuffix(".__init__")] = path
    graph = {name: _imports(path, modules, type_checking=True) - {name} for name, path in modules.items()}
    assert graph["lmforge.b"] == {"lmforge.c.d"}  # lazy
    assert graph["lmforge.c.d"] == {"lmforge.a", "lmforge.e"}  # type-only, and the other branch
    assert _cycles(graph) == [["lmforge.a", "lmforge.b", "lmforge.c.d", "lmforge.a"]]
    assert _imports(modules["lmforge.c.d"], modules, type_checking=False) == {"lmforge.e"}


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    """All modules, imported one after the other in a new interpreter: none fails to import, and
    importing them all starts no engine (heavy engines are imported lazily, inside functions)."""
    names = [n for n in _modules() if not n.endswith("__main__")]
    script = (
        "import atexit, gc, importlib, sys\n"
        "gc.disable()  # imports only, then exit: the collector would walk the growing heap for nothing\n"
        "atexit.register(gc.freeze)  # and so would the exit's last collection\n"
        "bad = []\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        if getattr(exc, 'name', '') in ('tensorrt_llm',):\n"
        "            continue  # an optional engine that is not installed\n"
        "        bad.append(f'{name}: {exc!r}')\n"
        "    except Exception as exc:\n"
        "        bad.append(f'{name}: {exc!r}')\n"
        "heavy = sorted(m for m in ('vllm', 'tensorrt_llm') if m in sys.modules)\n"
        "print('\\n'.join(bad + [f'imported at import time: {m}' for m in heavy]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "", proc.stdout
