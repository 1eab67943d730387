"""What lmforge reaches for inside the libraries it drives, in one table per library, checked at start.

lmforge uses more than the public API of a few libraries: transformers' continuous batching (LMI-Dist),
vLLM's internals (its plugins and the engine), moto's backends (the local SageMaker),
``importlib.metadata`` and transformers' import scans (:mod:`lmforge.import_cache`), and pytest and
pytest-xdist (the test suite's grouping). Each such use is one :class:`Reach`: the module or class, the
attribute names, and why lmforge needs them (the upstream issue, or what would break). Each library has
one :class:`Library`: its tested version and its reaches. The component that uses a library calls
:func:`check` on its table when it starts (the LMI-Dist engine core, the vLLM engine, the local
SageMaker, the test session), so an upstream rename stops that start with a message naming the missing
attribute, the installed and tested versions and the reason, instead of hanging a request or quietly
doing something else later. Checking imports only the modules a table names, and only when called:
this module imports nothing of the libraries itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lmforge.errors import LmforgeError


@dataclass(frozen=True)
class Reach:
    """Attributes ``names`` of ``owner`` that lmforge relies on.

    ``owner``: a module (``"vllm.v1.engine.utils"``) or a class in one (``"moto.ecr.models:Repository"``,
    dotted for a nested class). ``set_in``: the names are instance attributes that these methods of the
    class (or of a base) assign, so they are looked for in those methods' code, not on the class.
    ``why``: what relies on them, or the upstream issue that makes lmforge reach for them."""

    owner: str
    names: tuple[str, ...] = ()
    why: str = ""
    set_in: str | tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        return self.owner.replace(":", ".")

    @property
    def methods(self) -> tuple[str, ...]:
        if self.set_in is None:
            return ()
        return (self.set_in,) if isinstance(self.set_in, str) else self.set_in


@dataclass(frozen=True)
class Library:
    """One library's reaches. ``tested``: the release lmforge was written and tested against (what
    pyproject.toml pins); ``user``: the lmforge component that needs them; ``fix``: what to do."""

    name: str
    tested: str
    user: str
    reaches: tuple[Reach, ...] = field(default=())
    fix: str = ""
    #: the module whose ``__version__`` is the installed version (default: the distribution's metadata)
    version_module: str | None = None

    def installed(self) -> str:
        """The installed release, or ``"(not installed)"``."""
        if self.version_module is not None:
            try:
                return str(getattr(importlib.import_module(self.version_module), "__version__", "?"))
            except ImportError:
                return "(not installed)"
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(self.name)
        except PackageNotFoundError:
            return "(not installed)"


class ReachError(LmforgeError, RuntimeError):
    """A library lacks what lmforge reaches for: the start stops here."""


def resolve(path: str) -> Any:
    """The module or class ``path`` names (``"module"``, ``"module:Class"``, ``"module:Class.Inner"``)."""
    module, _, attrs = path.partition(":")
    found: Any = importlib.import_module(module)
    for attr in attrs.split(".") if attrs else ():
        found = getattr(found, attr)
    return found


def _assigned(owner: Any, methods: tuple[str, ...]) -> set[str]:
    """The attribute names the code of ``methods`` (on ``owner`` or a base) uses."""
    import inspect

    names: set[str] = set()
    for cls in getattr(owner, "__mro__", ()):
        for method in methods:
            found = cls.__dict__.get(method)
            # a method wrapped with functools.wraps (by a plugin of lmforge's, say): the original's code
            code = getattr(inspect.unwrap(found) if callable(found) else found, "__code__", None)
            if code is not None:
                names.update(code.co_names)
    return names


def has(owner: Any, name: str, methods: tuple[str, ...] = ()) -> bool:
    """Whether ``owner`` has ``name``: an attribute, a dataclass field, or a name ``methods`` assign."""
    if hasattr(owner, name) or name in getattr(owner, "__dataclass_fields__", {}):
        return True
    return bool(methods) and name in _assigned(owner, methods)


def missing(reaches: Iterable[Reach]) -> list[tuple[str, Reach]]:
    """What of ``reaches`` is not there, as (``owner.name``, its reach)."""
    out: list[tuple[str, Reach]] = []
    for reach in reaches:
        try:
            owner = resolve(reach.owner)
        except (ImportError, AttributeError):
            out.append((reach.label, reach))
            continue
        where = f" (set in {', '.join(reach.methods)})" if reach.methods else ""
        out += [
            (f"{reach.label}.{name}{where}", reach)
            for name in reach.names
            if not has(owner, name, reach.methods)
        ]
    return out


def message(library: Library, lacking: list[tuple[str, Reach]]) -> str:
    """What :func:`check` says: each missing attribute with its reason, both versions, the fix."""
    items = "; ".join(f"{label}" + (f" ({reach.why})" if reach.why else "") for label, reach in lacking)
    text = (
        f"{library.user} cannot start on {library.name} {library.installed()}: it lacks {items}. "
        f"{library.user} was written and tested against {library.name} {library.tested}"
    )
    return f"{text}. {library.fix}" if library.fix else text


def check(library: Library, reaches: Iterable[Reach] | None = None) -> None:
    """Raise :class:`ReachError` naming every attribute of ``library``'s table (or of ``reaches``) the
    installed release lacks."""
    if lacking := missing(library.reaches if reaches is None else reaches):
        raise ReachError(message(library, lacking))


#: uvicorn, as the model server uses it (``serving.launcher.make_server``'s ``DrainingServer`` overrides
#: ``handle_exit`` and ``capture_signals``: renamed upstream, the overrides are never called and a
#: SIGTERM no longer drains in-flight requests, nor exits 0). Kept here, beside the record, because the
#: server's own modules import nothing of lmforge's engines; ``make_server`` checks it.
UVICORN = Library(
    name="uvicorn",
    tested="0.54.x",
    user="lmforge's model server",
    reaches=(
        Reach(
            "uvicorn:Server",
            ("handle_exit", "capture_signals"),
            "overridden by the draining server: renamed upstream, a SIGTERM would not drain",
        ),
        Reach("uvicorn:Server", ("should_exit",), "the server's stop", set_in="__init__"),
    ),
    fix="Install a uvicorn of the tested minor release (pip install 'uvicorn==0.54.*')",
    version_module="uvicorn",
)


#: PyTorch's int8 kernels under LMI-Dist's W8A8 layers (``engines.lmi_dist.cpu_linear.Int8Weight``,
#: chosen by bench/quant_kernels.py): fbgemm's prepacked dynamic int8 linear, fed per-channel int8
#: weights made from a checkpoint's int8 values. Private ops (``torch.ops.quantized``) and a private
#: constructor; quantized tensors are deprecated upstream (pytorch#184982). ``quantize_int8`` checks it
#: where it uses fbgemm (lmforge's own int8 kernel, where chosen, needs none of it).
TORCH_INT8 = Library(
    name="torch",
    tested="2.13.x",
    user="LMI-Dist's W8A8 int8 layers",
    reaches=(
        Reach("torch:ops.quantized", ("linear_prepack", "linear_dynamic"), "fbgemm's int8 GEMM, prepacked"),
        Reach("torch", ("_make_per_channel_quantized_tensor",), "int8 values + scales -> a qint8 weight"),
    ),
    fix="Install the tested torch (torch==2.13.0), or serve the unquantized folder",
)

#: LMI-Dist's W4A16 (GPTQ) int4 weight-only layers (:mod:`lmforge.engines.lmi_dist.cpu_linear`, the
#: kernel chosen by bench/quant_kernels_int4.py): PyTorch's CPU int4 packing and matmul, private aten
#: ops. ``quantize_int4`` checks it.
TORCH_INT4 = Library(
    name="torch",
    tested="2.13.x",
    user="LMI-Dist's W4A16 int4 layers",
    reaches=(
        Reach(
            "torch:ops.aten",
            ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"),
            "int4 weight packing and the int4 x float matmul on CPU",
        ),
    ),
    fix="Install the tested torch (torch==2.13.0), or serve the unquantized folder",
)
