"""The package's shape: layers that import one way, no cycles, a small top of the package.

``sim/`` is laid out along the data flow (docs/architecture.md): inputs -> program ->
engine -> results, a session layer over them, studies and calibration over the session,
the Python API and the command line on top. These tests read every module's imports
(those inside functions too) with ``ast`` and hold the tree to that shape. A module's
size is not checked: it grows while it holds one idea and is split by idea, not by
line count (docs/architecture.md).
"""

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "sim"

# Lower numbers sit lower: a module may import its own layer and those below it.
LAYERS = {
    "sim.errors": 0, "sim.units": 0, "sim.fileio": 0, "sim.progress": 0, "sim.gc_tuning": 0,
    "sim.workers": 0,  # process pools tied to their parent (stdlib only)
    "sim.inputs": 1,
    "sim.program": 2,
    "sim.results": 3,
    "sim.engine": 4,
    "sim.session": 5,
    "sim.studies": 6, "sim.calibrate": 6, "sim.replay": 6,
    "sim.api": 7,
    "sim.commands": 8,
    "sim.cli": 9,
    "sim.__main__": 10, "sim": 10,
}
ALLOWED_UPWARD = {("sim.cli", "sim")}
"""``trainsim --version`` reads ``sim.__version__``."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        if "topologies" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


@cache
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for all the tests here (they only read it)."""
    return ast.parse(path.read_text())


def _imports(name: str, path: Path, modules) -> set[str]:
    """The sim modules ``name`` imports, at the top or inside functions."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in modules else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if (m == "sim" or m.startswith("sim.")) and m != name}


def _layer(module: str) -> int:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len)
    return LAYERS[best]


@cache
def _graph():
    """The sim modules and what each imports, read once for all the tests here (they only read it)."""
    modules = _modules()
    return modules, {m: _imports(m, p, modules) for m, p in modules.items()}


def test_every_import_goes_down_the_layers():
    _, graph = _graph()
    upward = sorted((m, t) for m, targets in graph.items() for t in targets
                    if _layer(t) > _layer(m) and (m, t) not in ALLOWED_UPWARD)
    assert upward == [], "imports against the data flow (see docs/architecture.md): " + ", ".join(
        f"{m} -> {t}" for m, t in upward)


def test_no_import_cycles_even_inside_functions():
    modules, graph = _graph()
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in modules or w == "sim":
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in modules:
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_private_name_is_imported_from_another_module():
    modules, _ = _graph()
    found = []
    for name, path in modules.items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sim"):
                found += [f"{name}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []


def test_the_top_of_the_package_is_small():
    top = [p.name for p in PKG.glob("*.py")]
    assert len(top) <= 12, top


def test_reading_a_trace_or_settings_does_not_load_matplotlib():
    # (SimPy's side of this is tests/test_kernel.py's)
    code = ("import sys\n"
            "import sim.results.trace, sim.results.metrics, sim.results.memory_timeline, sim.results.export\n"
            "import sim.results.summary, sim.inputs.schema, sim.inputs.experiment, sim.session\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_only_results_draw():
    modules, _ = _graph()
    users = {"matplotlib": set()}
    for name, path in modules.items():
        for node in ast.walk(_tree(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for n in names:
                for lib in users:
                    if n == lib or n.startswith(lib + "."):
                        users[lib].add(name)
    assert all(m.startswith("sim.results.") for m in users["matplotlib"]), users["matplotlib"]


def test_studies_and_results_use_program_through_its_api():
    """studies/ and results/ reach program/ only through ``sim.program.api`` (issue 52, item 7):
    its internals (the build context's fields, the workload's tables) can change behind it."""
    _, graph = _graph()
    reached = sorted((m, t) for m, targets in graph.items() for t in targets
                     if m.startswith(("sim.studies", "sim.results")) and t.startswith("sim.program")
                     and t != "sim.program.api")
    assert reached == []
