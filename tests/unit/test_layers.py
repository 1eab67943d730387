"""The package's layers, and no import cycles.

Every module imports only from its own layer or the ones below it (imports under ``if
TYPE_CHECKING:`` are type references, not dependencies, and are not counted); modules import
without cycles at module level; and every module imports on its own in a fresh interpreter.
docs/architecture.md draws the same layers.
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


def _imports(path: Path, modules: dict[str, Path], *, module_level_only: bool) -> set[str]:
    """lmforge modules that ``path`` imports, without those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child, top)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if module_level_only:
                return
            top = False
        if isinstance(node, ast.Import):
            found.update(_resolve(a.name, modules) for a in node.names if a.name.startswith("lmforge"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lmforge"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(_resolve(full if full in modules else node.module, modules))
        for child in ast.iter_child_nodes(node):
            visit(child, top)

    visit(tree, True)
    return found


def test_every_package_has_a_layer() -> None:
    packages = {_package(m) for m in _modules()}
    assert packages <= set(LAYERS), f"add to LAYERS: {sorted(packages - set(LAYERS))}"


def test_modules_import_only_from_their_layer_or_below() -> None:
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        mine = LAYERS[_package(name)]
        for target in _imports(path, modules, module_level_only=False):
            if LAYERS[_package(target)] > mine:
                wrong.append(f"{name} (layer {mine}) imports {target} (layer {LAYERS[_package(target)]})")
    assert wrong == [], "\n".join(wrong)


def test_no_import_cycles_at_module_level() -> None:
    modules = _modules()
    graph = {name: _imports(path, modules, module_level_only=True) - {name} for name, path in modules.items()}
    # a package imports its own __init__ when a submodule is imported: that edge is not a cycle
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
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
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    """All modules, imported one after the other in a new interpreter: none fails to import, and
    importing them all starts no engine (heavy engines are imported lazily, inside functions)."""
    names = [n for n in _modules() if not n.endswith("__main__")]
    script = (
        "import importlib, sys\n"
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
