"""The agent's layout: its modules import each other without a circle, and the product never
imports the drills or the fault injectors."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[2] / "agent" / "src"
ROOT = "sdc_agent"


def _modules() -> dict[str, Path]:
    """Every module of the agent by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in sorted((AGENT / ROOT).rglob("*.py")):
        parts = list(path.relative_to(AGENT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _targets(
    node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str]
) -> set[str]:
    """The agent modules an import statement imports (``from pkg import mod`` names the module;
    ``from mod import name`` names ``mod``)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules
    if node.level:
        package = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    found = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in modules:
            found.add(submodule)
        elif base in modules:
            found.add(base)
        elif node.level:
            found.add(base)  # a relative import of nothing: reported by the graph's test
    return found


def import_graph() -> dict[str, set[str]]:
    """Who imports whom inside the agent: every import statement (module level, inside
    functions, under ``TYPE_CHECKING``), and the packages an import runs on the way.

    Importing ``a.b.c`` from outside ``a.b`` runs ``a.b``'s ``__init__`` first, so that package
    counts as imported too (except the root package, which every module is inside): a package
    whose ``__init__`` imports its modules is a real step of a circle.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for importer, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = _targets(node, importer, is_package, set(modules))
            for target in targets:
                parts = target.split(".")
                for depth in range(2, len(parts)):
                    package = ".".join(parts[:depth])
                    if not (importer == package or importer.startswith(package + ".")):
                        graph[importer].add(package)
                if target != importer:
                    graph[importer].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as a list of names (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_agent_imports_without_a_circle():
    # Given the agent's import graph, every import statement counted
    graph = import_graph()
    # (each relative import names a module of the agent: none was left behind by a move)
    dangling = sorted(
        f"{m} -> {t}" for m, targets in graph.items() for t in targets if t not in graph
    )
    assert not dangling, "relative imports of no module: " + "; ".join(dangling)
    # (read for real: the guard's coordinator reaches the adapters, and they build the audit)
    assert len(graph) > 40
    assert "sdc_agent._coordinator" in graph["sdc_agent.guard"]
    assert "sdc_agent.parallel" in graph["sdc_agent._coordinator"]
    assert "sdc_agent.checks.replay.audit" in graph["sdc_agent.parallel.adapter"]
    # Then no module imports itself through others
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_sees_a_circle():
    # Given a graph with a circle through a package, then it is found and printed in order
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
def test_importing_the_agent_loads_no_drill_and_no_fault_injector():
    # When a fresh interpreter imports the agent (and uses the guard's public names)
    loaded = _run(
        "import sys, sdc_agent as sdc\n"
        "assert sdc.Guard and sdc.Schedule and sdc.protect and sdc.find_divergent_ranks\n"
        "print(sorted(m for m in sys.modules if m.startswith('sdc_agent.drill')"
        " or m == 'sdc_agent.faults'))"
    )
    # Then neither the drills nor the fault injectors came with it
    assert loaded == "[]"


@pytest.mark.slow
def test_the_fault_injectors_stay_reachable_by_their_old_names():
    # When code written before the move reaches the injectors both ways
    out = _run(
        "import sdc_agent as sdc\n"
        "first = sdc.faults.ScaleGemmElement\n"
        "import sdc_agent.faults\n"
        "from sdc_agent.drills import faults\n"
        "print(sdc_agent.faults is faults, first is faults.ScaleGemmElement, 'faults' in dir(sdc))"
    )
    # Then they are the one module of the drills package, loaded on first use
    assert out == "True True True"


SENSOR_LAYERS = ("maths", "runtime", "ops")
"""The sensors' layers, each importing only those before it (``sdc_agent/sensors/__init__``)."""


def test_the_sensor_layers_import_only_downwards():
    # Given the import graph of the sensors' three layers and protect()
    graph = import_graph()
    base = "sdc_agent.sensors"

    def layer(module: str) -> str | None:
        if not module.startswith(base + "."):
            return None
        first = module[len(base) + 1 :].split(".")[0]
        return first if first in SENSOR_LAYERS else "protection"

    order = {name: i for i, name in enumerate((*SENSOR_LAYERS, "protection"))}
    members = [m for m in graph if layer(m) is not None]
    # (read for real: every layer has modules, and the ops build on both lower layers)
    assert {layer(m) for m in members} == set(order)
    assert f"{base}.runtime.board" in graph[f"{base}.ops.linear"]
    assert f"{base}.maths.abft" in graph[f"{base}.ops.linear"]
    # Then no module of a layer imports a module of a layer above it
    upward = sorted(
        f"{m} -> {t}"
        for m in members
        for t in graph[m]
        if (up := layer(t)) is not None and order[up] > order[layer(m) or ""]
    )
    assert not upward, "a sensors layer imports one above it: " + "; ".join(upward)
    # And the maths knows nothing of torch.nn modules, boards or steps: it imports no agent
    # module outside the maths
    maths = [m for m in members if layer(m) == "maths"]
    outside = sorted(f"{m} -> {t}" for m in maths for t in graph[m] if layer(t) != "maths")
    assert not outside, "; ".join(outside)


@pytest.mark.slow
def test_the_sensors_export_a_small_surface_and_keep_the_flat_layouts_names():
    # When a fresh interpreter imports the sensors and reaches a name of the flat layout
    out = _run(
        "import sdc_agent.sensors as s\n"
        "from sdc_agent.sensors import ProtectedLinear, SensorBoard, softmax_ratio\n"
        "from sdc_agent.sensors.ops.linear import ProtectedLinear as P\n"
        "from sdc_agent.sensors.runtime.board import SensorBoard as B\n"
        "print(sorted(s.__all__), P is ProtectedLinear and B is SensorBoard,"
        " 'softmax_ratio' in dir(s), hasattr(s, 'no_such_name'))"
    )
    # Then the public surface is the few names a user writes, and the old names are the same
    # objects as their modules' (so isinstance checks written against them still hold)
    assert out == (
        "['ResidualAdd', 'SensorConfig', 'describe_families', 'find_board', 'protect',"
        " 'protected_layers'] True True False"
    )
