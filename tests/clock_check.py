"""Finds tests that time the machine: an assertion on a clock reading or a duration, or a sleep used
as a clock.

A test passes or fails by what happened (a log line, a counter, the order of events), never by how
long something took: on a busy machine (CI runs the whole suite on two cores) any bound on a duration
can be missed, and a sleep before an action can be too short. Timings live in ``bench/``.

What counts, per module (``tests/unit/test_no_clock_in_tests.py`` runs it over ``tests/``):

- **clock**: a call of ``time.monotonic``/``perf_counter``/``time``/``process_time``/``thread_time``
  (and their ``_ns`` forms), ``loop.time()``, ``datetime.now``/``utcnow``, ``os.times``,
  ``resource.getrusage``, psutil's ``cpu_times``; a name bound, in the same function or at module
  level, to an expression that holds a clock or such a name; a call of a function of the module that
  returns one.
- **duration**: a name, attribute, called function or string key whose words include ``seconds``,
  ``elapsed``, ``duration``, ``took``, ``latency``, ``wall`` (``init_seconds``, ``result.took``,
  ``rec["wall_s"]``), or that ends in ``_s``/``_ms`` after a word (``stop_s``, ``cpu_ms``).

An ``assert`` whose condition compares a clock or a duration is a finding, except
- a hang guard: ``clock < deadline`` (or ``<=``) inside a polling loop (below), the generous limit
  on a wait for a condition polled in that loop;
- a bracket ``before <= stamp <= after`` whose middle term reads no clock: it orders events (the
  product stamped a time between two readings), which no machine speed can break;
- a lower bound of zero (``x > 0``, ``x >= 0``): a figure was recorded, which a slow machine cannot miss.

A ``time.sleep``/``asyncio.sleep`` statement outside a polling loop is a finding (a sleep as a clock:
"wait 0.3 s, then it will have happened"); inside a ``while``, or a ``for`` that can ``break`` or
``return``, it is a poll interval or a pacing of load. A sleep
in a fake that plays a slow peer, or the child process of a test, states its reason on the line with
``# sleep-ok: <reason>``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

CLOCK_FUNCS = frozenset(
    {
        "monotonic",
        "monotonic_ns",
        "perf_counter",
        "perf_counter_ns",
        "process_time",
        "process_time_ns",
        "thread_time",
        "thread_time_ns",
        "getrusage",
        "cpu_times",
        "now",
        "utcnow",
    }
)
"""Called as an attribute (``time.monotonic()``, ``psutil.Process().cpu_times()``) these read a clock."""
CLOCK_ATTR_CALLS = frozenset({("time", "time"), ("time", "time_ns"), ("os", "times"), ("loop", "time")})
"""``module.attr()`` pairs that read a clock where the attribute's name alone is too common."""
DURATION_WORDS = frozenset({"seconds", "secs", "elapsed", "duration", "took", "latency", "wall"})
SETTING_WORDS = frozenset({"timeout", "limit", "deadline", "per"})
"""``health_check_timeout_s``, ``tokens_per_s``: a setting or a rate, not a measured duration."""
_UNIT_SUFFIX = re.compile(r"[a-z0-9]_(s|ms)$")
_ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
SLEEP_OK = "# sleep-ok:"
_NUMERIC_BUILTINS = frozenset({"sum", "max", "min", "abs", "float", "int", "round", "sorted"})


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str  # "assert" or "sleep"
    text: str

    def __str__(self) -> str:
        what = "asserts on a clock or a duration" if self.kind == "assert" else "sleeps as a clock"
        return f"{self.path}:{self.line}: {what}: {self.text}"


def is_duration_name(name: str) -> bool:
    """``init_seconds``, ``took``, ``wall_s``, ``cpu_ms``: a name that says it holds a duration."""
    if name.isupper():  # a constant: a setting, not a measurement
        return False
    lowered = name.lower().strip("_")
    words = set(lowered.split("_"))
    if words & SETTING_WORDS:
        return False
    return bool(DURATION_WORDS & words) or bool(_UNIT_SUFFIX.search(lowered))


def _call_name(func: ast.expr) -> tuple[str | None, str | None]:
    """(owner, name) of a call's function: ``time.monotonic`` -> ("time", "monotonic")."""
    if isinstance(func, ast.Attribute):
        owner = func.value
        if isinstance(owner, ast.Name):
            return owner.id, func.attr
        return (owner.attr if isinstance(owner, ast.Attribute) else ""), func.attr
    if isinstance(func, ast.Name):
        return None, func.id
    return None, None


class _Scope:
    """What reads a clock in one module: functions that return a clock reading or a duration, and
    the names bound to one (module-level ones, and per function its own)."""

    def __init__(self, tree: ast.Module) -> None:
        self.timed_funcs: set[str] = set()
        self.clock_funcs: set[str] = set()
        self.tuple_funcs: dict[str, tuple[frozenset[int], frozenset[int]]] = {}
        """Functions that return a tuple: which places hold a clock reading, which a duration."""
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.module = _Names(set(), set())
        while True:  # to a fixed point: a helper may return another helper's clock reading
            before = (len(self.timed_funcs), len(self.clock_funcs), dict(self.tuple_funcs))
            self.module = self.bind(top, _Names(set(), set()))
            for fn in funcs:
                self._learn(fn)
            if before == (len(self.timed_funcs), len(self.clock_funcs), self.tuple_funcs):
                break

    def _learn(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        local = self.local_names(fn)
        returns = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
        if returns and all(isinstance(r, ast.Tuple) for r in returns):
            tuples = [r for r in returns if isinstance(r, ast.Tuple)]
            clock = frozenset(i for t in tuples for i, e in enumerate(t.elts) if self.reads_clock(e, local))
            timed = frozenset(i for t in tuples for i, e in enumerate(t.elts) if self.timed(e, local))
            self.tuple_funcs[fn.name] = (clock, timed)
            return
        if any(self.reads_clock(r, local) for r in returns):
            self.clock_funcs.add(fn.name)
        if any(self.timed(r, local) for r in returns):
            self.timed_funcs.add(fn.name)

    def bind(self, body: list[ast.stmt], names: _Names) -> _Names:
        """``names`` grown by every binding in ``body`` of a clock reading or a duration: assignments
        (place by place where a tuple is unpacked), loop targets, and ``x.append(reading)``."""
        clock, timed = set(names.clock), set(names.timed)
        for _ in range(3):  # chains of assignments: a = clock(); b = a - start
            for stmt in body:
                for sub in ast.walk(stmt):
                    for value, targets in self._bindings(sub):
                        now = _Names(clock, timed)
                        if self.reads_clock(value, now):
                            clock |= targets
                        if self.timed(value, now):
                            timed |= targets
        return _Names(clock, timed)

    def _bindings(self, node: ast.AST) -> list[tuple[ast.expr, set[str]]]:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple):
            target, value = node.targets[0], node.value
            if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
                return [(v, _names_in(t)) for t, v in zip(target.elts, value.elts, strict=True)]
            _, name = _call_name(value.func) if isinstance(value, ast.Call) else (None, None)
            if name in self.tuple_funcs:
                clock, timed = self.tuple_funcs[name]
                marker = _CLOCK_MARK if clock else _DURATION_MARK
                return (
                    [(marker, _names_in(t)) for i, t in enumerate(target.elts) if i in clock]
                    + [
                        (_DURATION_MARK, _names_in(t))
                        for i, t in enumerate(target.elts)
                        if i in timed - clock
                    ]
                    if (clock or timed)
                    else []
                )
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.args
            and node.func.attr in ("append", "add", "extend", "insert")
            and isinstance(node.func.value, ast.Name)
        ):
            return [(node.args[-1], {node.func.value.id})]
        value, targets = _assignment(node)
        return [(value, targets)] if value is not None else []

    def local_names(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> _Names:
        return self.bind(fn.body, self.module)

    def reads_clock(self, expr: ast.AST, names: _Names) -> bool:
        """A clock reading: a clock call, a name bound to one, a helper of the module returning one,
        or arithmetic on those. A call's result is one only for the builtins that pass numbers on
        (``sum``, ``max``...), not for any call that merely takes a deadline as an argument."""
        if isinstance(expr, ast.Call):
            owner, name = _call_name(expr.func)
            if (name in CLOCK_FUNCS and owner is not None) or (owner, name) in CLOCK_ATTR_CALLS:
                return True
            if name in self.clock_funcs:
                return True
            if isinstance(expr.func, ast.Name) and name in _NUMERIC_BUILTINS:
                return any(self.reads_clock(a, names) for a in expr.args)
            return isinstance(expr.func, ast.Attribute) and self.reads_clock(expr.func.value, names)
        if isinstance(expr, ast.Name):
            return expr.id in names.clock
        return any(self.reads_clock(child, names) for child in ast.iter_child_nodes(expr))

    def timed(self, expr: ast.AST, names: _Names) -> bool:
        """A clock reading or a duration (by its name, or a name bound to one)."""
        return self.reads_clock(expr, names) or any(self._duration(n, names) for n in ast.walk(expr))

    def _duration(self, node: ast.AST, names: _Names) -> bool:
        if isinstance(node, ast.Call):
            _, name = _call_name(node.func)
            return name is not None and (name in self.timed_funcs or is_duration_name(name))
        if isinstance(node, ast.Name):
            return node.id in names.timed or is_duration_name(node.id)
        if isinstance(node, ast.Attribute):
            return is_duration_name(node.attr)
        if isinstance(node, ast.Subscript):
            key = node.slice
            return (
                isinstance(key, ast.Constant) and isinstance(key.value, str) and is_duration_name(key.value)
            )
        return False


@dataclass(frozen=True)
class _Names:
    clock: set[str]
    timed: set[str]


_CLOCK_MARK = ast.parse("time.monotonic()", mode="eval").body
_DURATION_MARK = ast.Name(id="_seconds")
"""Stand-ins for a place of a returned tuple that holds a clock reading or a duration."""


def _names_in(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _assignment(node: ast.AST) -> tuple[ast.expr | None, set[str]]:
    if isinstance(node, ast.Assign):
        return node.value, {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
        return node.value, {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    if isinstance(node, ast.NamedExpr):
        return node.value, {node.target.id}
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return node.iter, {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return None, set()


def _is_zero(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Constant) and expr.value in (0, 0.0) and not isinstance(expr.value, bool)


class _Checker(ast.NodeVisitor):
    def __init__(self, path: str, source: str, scope: _Scope) -> None:
        self.path, self.lines, self.scope = path, source.splitlines(), scope
        self.findings: list[Finding] = []
        self.loops = 0
        self.names = scope.module

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        saved, saved_loops = self.names, self.loops
        self.names, self.loops = self.scope.local_names(node), 0  # a nested def runs on its own
        self.generic_visit(node)
        self.names, self.loops = saved, saved_loops

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def _loop(self, node: ast.For | ast.AsyncFor | ast.While) -> None:
        # a ``while`` waits for its condition; a ``for`` polls only when it can end early (a
        # ``for`` over cases with a sleep in each is a sleep as a clock once a case)
        polls = isinstance(node, ast.While) or any(
            isinstance(n, (ast.Break, ast.Return)) for stmt in node.body for n in ast.walk(stmt)
        )
        self.loops += polls
        self.generic_visit(node)
        self.loops -= polls

    visit_For = _loop
    visit_AsyncFor = _loop
    visit_While = _loop

    def visit_Assert(self, node: ast.Assert) -> None:
        compares = [n for n in ast.walk(node.test) if isinstance(n, ast.Compare)]
        if any(self._bad_compare(c) for c in compares):
            self._add(node, "assert")
        self.generic_visit(node)

    def _bad_compare(self, cmp: ast.Compare) -> bool:
        terms = [cmp.left, *cmp.comparators]
        clock = [self.scope.reads_clock(t, self.names) for t in terms]
        ordering = all(isinstance(op, _ORDERING) for op in cmp.ops)
        if not ordering:
            # an equality reads a clock (a duration worked out from fixed data is arithmetic)
            return any(clock) and all(isinstance(op, (ast.Eq, ast.NotEq, *_ORDERING)) for op in cmp.ops)
        if not any(clock) and not any(self.scope.timed(t, self.names) for t in terms):
            return False
        if len(terms) == 2:
            (left, right), op = terms, cmp.ops[0]
            if self.loops and isinstance(op, (ast.Lt, ast.LtE)) and _direct_clock(left):
                return False  # a hang guard on a polled wait
            if (isinstance(op, (ast.Gt, ast.GtE)) and _is_zero(right)) or (
                isinstance(op, (ast.Lt, ast.LtE)) and _is_zero(left)
            ):
                return False  # recorded: above zero
        # a stamp between two readings is an order of events
        bracket = len(terms) == 3 and all(isinstance(op, (ast.Lt, ast.LtE)) for op in cmp.ops)
        return not (bracket and clock[0] and clock[2] and not self.scope.timed(terms[1], self.names))

    def visit_Expr(self, node: ast.Expr) -> None:
        call = node.value.value if isinstance(node.value, ast.Await) else node.value
        if isinstance(call, ast.Call) and not self.loops:
            owner, name = _call_name(call.func)
            if name == "sleep" and owner in ("time", "asyncio", "trio", "anyio"):
                arg = call.args[0] if call.args else None
                if not (arg is not None and _is_zero(arg)) and SLEEP_OK not in self._line(node):
                    self._add(node, "sleep")
        self.generic_visit(node)

    def _line(self, node: ast.stmt) -> str:
        return self.lines[node.lineno - 1] if node.lineno <= len(self.lines) else ""

    def _add(self, node: ast.stmt, kind: str) -> None:
        self.findings.append(Finding(self.path, node.lineno, kind, self._line(node).strip()))


def _direct_clock(expr: ast.expr) -> bool:
    """``time.monotonic()`` itself, as a hang guard compares it with its deadline."""
    if not isinstance(expr, ast.Call):
        return False
    owner, name = _call_name(expr.func)
    return (name in CLOCK_FUNCS and owner is not None) or (owner, name) in CLOCK_ATTR_CALLS


def check_source(source: str, path: str = "<test>") -> list[Finding]:
    """The findings in one module's source."""
    tree = ast.parse(source, filename=path)
    checker = _Checker(path, source, _Scope(tree))
    checker.visit(tree)
    return checker.findings


def check_tree(root: Path) -> list[Finding]:
    """The findings in every test module below ``root`` (fakes of other libraries excluded)."""
    findings: list[Finding] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if "/fakes/" in f"/{rel}":
            continue
        findings += check_source(path.read_text(), rel)
    return findings
